"""RQ's records in Redis as codepool reads and tidies them from outside an RQ worker:
the key names RQ builds (each from RQ's own classes, never spelled here) and the
retirement of a lost worker. worker/rq_worker.py holds what codepool changes in RQ's
behaviour; this module holds what it assumes of RQ's data.

What this relies on in RQ (checked by tests/worker/test_rq_contract.py):

0. Every key RQ makes starts with ``rq.defaults.RQ_KEY_PREFIX`` and a colon.
1. A queue's list is ``Queue.redis_queue_namespace_prefix + name`` and its reliable
   dequeue's intermediate list is ``IntermediateQueue.get_intermediate_queue_key`` of
   that; the set of queues is ``Queue.redis_queues_keys``.
2. A job's hash is ``Job.key_for(job_id)``; its results stream ``Result.get_key``.
3. A worker's hash is ``Worker.redis_worker_namespace_prefix + name``, listed in the
   set ``REDIS_WORKER_KEYS``; the set of its executions is
   ``WORKER_EXECUTIONS_KEY_TEMPLATE`` of its name; its command channel is
   ``PUBSUB_CHANNEL_TEMPLATE % name``.
4. A queue's started registry is ``StartedJobRegistry.key_template.format(queue)``;
   ``remove_executions(job)`` takes a job's executions out of it.
5. ``Worker.find_by_key``, ``get_current_job_id`` and ``unregister`` read and remove a
   worker that is not running (a lapsed dispatcher's records).
"""

from __future__ import annotations

import redis
from rq import Worker
from rq.command import PUBSUB_CHANNEL_TEMPLATE
from rq.defaults import RQ_KEY_PREFIX
from rq.exceptions import NoSuchJobError
from rq.executions import WORKER_EXECUTIONS_KEY_TEMPLATE
from rq.intermediate_queue import IntermediateQueue
from rq.job import Job
from rq.queue import Queue
from rq.registry import StartedJobRegistry
from rq.results import Result
from rq.serializers import Serializer
from rq.worker_registration import REDIS_WORKER_KEYS, unregister


def key_pattern() -> str:
    """A glob of every key RQ makes (an ACL's ``~pattern``)."""
    return RQ_KEY_PREFIX + ":*"


def queue_key(queue: str) -> str:
    """The list RQ enqueues job ids of queue ``queue`` on."""
    return Queue.redis_queue_namespace_prefix + queue


def intermediate_queue_key(queue: str) -> str:
    """The list RQ's reliable dequeue (BLMOVE) moves job ids of ``queue`` to."""
    return IntermediateQueue.get_intermediate_queue_key(queue_key(queue))


def queues_key() -> str:
    """The set of every queue's key."""
    return Queue.redis_queues_keys


def job_key(job_id: str) -> str:
    """A job's hash."""
    return Job.key_for(job_id)


def result_stream_key(job_id: str) -> str:
    """The stream RQ writes a job's results to."""
    return str(Result.get_key(job_id))  # type: ignore[no-untyped-call]


def worker_key(name: str) -> str:
    """Worker ``name``'s hash (its state, heartbeat, current job)."""
    return Worker.redis_worker_namespace_prefix + name


def worker_executions_key(name: str) -> str:
    """The set of worker ``name``'s executions (its heartbeat sets its expiry)."""
    return WORKER_EXECUTIONS_KEY_TEMPLATE.format(name)


def workers_key() -> str:
    """The set of every live worker's key."""
    return REDIS_WORKER_KEYS


def started_registry_key(queue: str) -> str:
    """The sorted set of jobs of ``queue`` being run."""
    return StartedJobRegistry.key_template.format(queue)


def command_channel(name: str) -> str:
    """The pub/sub channel RQ's ``send_command`` uses for worker ``name``."""
    return PUBSUB_CHANNEL_TEMPLATE % name


def retire_worker(
    conn: redis.Redis,
    name: str,
    *,
    queue: str,
    serializer: Serializer | str | None,
    job_ttl_s: int,
) -> str | None:
    """Take lost worker ``name`` out of RQ's worker list, delete its hash, and take the
    job it held (if any) out of ``queue``'s started registry, its hash left to expire
    in ``job_ttl_s``. Returns that job's id (None if it held none, or no such worker
    was registered); the job's hash may be gone already."""
    worker = Worker.find_by_key(worker_key(name), connection=conn, serializer=serializer)
    if worker is None:
        return None
    job_id = worker.get_current_job_id()
    unregister(worker)
    conn.delete(worker.key)
    if not job_id:
        return None
    try:
        job = Job.fetch(job_id, connection=conn, serializer=serializer)
    except NoSuchJobError:
        return job_id
    registry = StartedJobRegistry(queue, connection=conn, serializer=serializer)
    registry.remove_executions(job)
    conn.expire(job.key, job_ttl_s)
    return job_id
