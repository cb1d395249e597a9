"""Announcing batches on the RQ queue: small jobs that name a batch, msgpack-serialized.

The batch itself is stored once (``ledger.SUBMIT``); an announcement only tells one idle
dispatcher to join it and claim work. A batch is announced to as many hosts as can
usefully share it (one dispatcher per host waits on the queue at a time, so each takes
one), and again by a janitor when work is released from a lapsed claim.
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Sequence

import redis
from redis.client import Pipeline
from rq import Queue
from rq.job import Job
from rq.utils import now

from codepool.common.codec import MsgpackSerializer
from codepool.common.rq_records import job_key, queue_key
from codepool.common.settings import Settings
from codepool.common.wire import JOB_FUNCTION, encode_announcement

# A host that joins a batch should find at least this many snippets to claim.
MIN_SHARE = 2
# A batch is announced to at most this many times the hosts its size needs.
FANOUT_HOSTS_PER_NEED = 2
# An announcement's job id: its batch's (new_batch_id) and a suffix of its own.
_ANNOUNCEMENT_ID = re.compile(r"[0-9a-f]{32}-[0-9a-f]{8}")


def batch_queue(conn: redis.Redis, settings: Settings) -> Queue:
    return Queue(settings.queue, connection=conn, serializer=MsgpackSerializer)


def announcements_for(size: int, live_hosts: int, fleet_slots: int = 0) -> int:
    """How many hosts to invite to a batch of ``size`` snippets (one dispatcher of each
    joins it, and may use all the slots of its host that its siblings leave free): one
    per MIN_SHARE snippets, at most the live hosts, and, when the fleet's slots are
    known, at most FANOUT_HOSTS_PER_NEED times the hosts the batch needs at the fleet's
    mean host size (a host of 64 slots takes a batch of 64 alone; a second invitation
    covers a host that is busy)."""
    count = min(live_hosts, math.ceil(size / MIN_SHARE))
    if fleet_slots > 0 and live_hosts > 0:
        per_host = max(MIN_SHARE, fleet_slots / live_hosts)
        count = min(count, FANOUT_HOSTS_PER_NEED * math.ceil(size / per_host))
    return max(1, count)


def announcement(queue: Queue, settings: Settings, batch_id: str) -> Job:
    """One announcement of a batch, not enqueued yet (a producer makes its next batch's
    ahead of time, see CodePool.submit; RQ takes some 0.1 ms to make one)."""
    return queue.create_job(
        JOB_FUNCTION,
        args=(encode_announcement(batch_id),),
        job_id=f"{batch_id}-{uuid.uuid4().hex[:8]}",
        timeout=-1,  # a batch's dispatchers hold leases instead; see worker/lease.py
        result_ttl=settings.job_result_ttl_s,
        failure_ttl=settings.job_failure_ttl_s,
        ttl=settings.batch_ttl_s,
    )


def announce(
    queue: Queue,
    settings: Settings,
    *,
    batch_id: str,
    size: int,
    count: int = 1,
    pipeline: Pipeline | None = None,
    made: Job | None = None,
) -> list[str]:
    """Enqueue ``count`` announcements of a batch (on ``pipeline`` if given, else in one
    round trip of its own); returns their job ids. made: one of them, made beforehand
    by ``announcement``. Descriptions name the batch, never the code, because RQ logs
    descriptions."""
    jobs = []
    if made is not None:
        made.created_at = now()  # RQ's, as if it were made now
        jobs.append(made)
    jobs += [announcement(queue, settings, batch_id) for _ in range(count - len(jobs))]
    # One round trip (RQ makes the pipeline a MULTI/EXEC): each job hash is written
    # before its id is pushed, so no worker can pop an unsaved job.
    pipe = pipeline if pipeline is not None else queue.connection.pipeline(transaction=False)
    for job in jobs:
        job.description = f"codepool batch {batch_id} ({size} snippets)"
        queue.enqueue_job(job, pipeline=pipe)
    if pipeline is None:
        pipe.execute()
        pipe.reset()
    return [job.id for job in jobs]


def withdraw_announcements(pipe: Pipeline, settings: Settings, job_ids: Sequence[str]) -> None:
    """Take announcements off the queue and drop their job hashes (on ``pipe``): a
    cancelled batch's, so the dispatchers do not take them one by one to find nothing.
    One a dispatcher took already is not touched by the LREM (and finds nothing)."""
    key = queue_key(settings.queue)
    for job_id in job_ids:
        pipe.lrem(key, 1, job_id)
        pipe.delete(job_key(job_id))


def batch_of_job(job_id: str) -> str:
    """The batch an announcement job belongs to (its id is ``{batch_id}-{suffix}``)."""
    return job_id.rsplit("-", 1)[0]


def announced_batch(job_id: str) -> str | None:
    """The batch a job id names, if it is an id ``announce`` makes; else None."""
    return batch_of_job(job_id) if _ANNOUNCEMENT_ID.fullmatch(job_id) else None
