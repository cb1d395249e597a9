"""Putting batches on the RQ queue: one job per batch, msgpack-serialized, short TTLs."""

from __future__ import annotations

import uuid

import redis
from rq import Queue
from rq.job import Job

from codepool.common.codec import MsgpackSerializer
from codepool.common.settings import Settings
from codepool.common.wire import JOB_FUNCTION


def batch_queue(conn: redis.Redis, settings: Settings) -> Queue:
    return Queue(settings.queue, connection=conn, serializer=MsgpackSerializer)


def enqueue_batch(
    queue: Queue,
    settings: Settings,
    *,
    batch_id: str,
    payload: bytes,
    size: int,
    at_front: bool = False,
) -> Job:
    """Enqueue one batch job in a single round trip. Its description names the batch,
    never the code, because RQ logs descriptions."""
    job = queue.create_job(
        JOB_FUNCTION,
        args=(payload,),
        # A re-enqueued remainder needs a job id of its own: RQ ids are unique.
        job_id=f"{batch_id}-{uuid.uuid4().hex[:8]}" if at_front else batch_id,
        timeout=-1,  # batches heartbeat instead; see worker/job.py
        result_ttl=settings.job_result_ttl_s,
        failure_ttl=settings.job_failure_ttl_s,
        ttl=settings.batch_ttl_s,
        description=f"codepool batch {batch_id} ({size} snippets)",
    )
    # One non-transactional pipeline instead of RQ's two MULTI/EXEC round trips: the job
    # hash is written before its id is pushed, so no worker can pop an unsaved job.
    with queue.connection.pipeline(transaction=False) as pipe:
        queue.enqueue_job(job, pipeline=pipe, at_front=at_front)
        pipe.execute()
    return job
