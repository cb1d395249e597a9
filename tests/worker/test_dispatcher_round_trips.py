"""RQ's per-job bookkeeping in a dispatcher costs few round trips: a worker heartbeat is
one pipeline (the worker's state in it) and is not repeated within ten seconds, a state
RQ sets again unchanged is not sent, IDLE rides with the next heartbeat, and the job
heartbeat RQ sends for callbacks codepool never has is not sent; a job is readied in one
round trip rather than two, and the heartbeat right after a job rides with the next;
Redis holds the same."""

from __future__ import annotations

from typing import Any

import redis
from rq import Queue
from rq.suspension import is_suspended
from rq.worker import WorkerStatus

from codepool.common.codec import MsgpackSerializer
from codepool.common.wire import JOB_FUNCTION
from codepool.worker.dispatcher import Dispatcher
from codepool.worker.rq_worker import CodepoolJob


class CountingConnection(redis.connection.Connection):
    """A real connection that counts what it sends: one send per round trip."""

    sends = 0

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        CountingConnection.sends += 1
        super().send_packed_command(command, check_health)


def round_trips(action: Any) -> int:
    before = CountingConnection.sends
    action()
    return CountingConnection.sends - before


def _counted(redis_url: str, name: str) -> tuple[redis.Redis, Queue, Dispatcher]:
    """A dispatcher on a connection that counts its round trips."""
    pool = redis.ConnectionPool.from_url(redis_url, connection_class=CountingConnection)
    conn = redis.Redis(connection_pool=pool)
    queue = Queue("codepool", connection=conn, serializer=MsgpackSerializer)
    worker = Dispatcher(
        [queue], connection=conn, name=name, serializer=MsgpackSerializer, job_class=CodepoolJob
    )
    conn.ping()
    return conn, queue, worker


def test_heartbeats_and_repeated_states_cost_one_round_trip(redis_url: str) -> None:
    conn, queue, worker = _counted(redis_url, "counted")
    assert round_trips(worker.heartbeat) == 1
    assert conn.hget(worker.key, "last_heartbeat") and conn.ttl(worker.key) > 0
    assert conn.hget(worker.key, "state") == b"starting"
    assert round_trips(worker.heartbeat) == 0
    # A heartbeat with a TTL of its own (RQ's, for a job) always goes.
    assert round_trips(lambda: worker.heartbeat(600)) == 1
    assert conn.ttl(worker.key) > 95
    assert round_trips(lambda: worker.set_state(WorkerStatus.BUSY)) == 1
    assert round_trips(lambda: worker.set_state(WorkerStatus.BUSY)) == 0
    assert conn.hget(worker.key, "state") == b"busy"
    # IDLE (the end of a job) rides with the next heartbeat, which then goes however
    # recent the last one was.
    assert round_trips(lambda: worker.set_state(WorkerStatus.IDLE)) == 0
    assert worker.get_state() == WorkerStatus.IDLE
    assert round_trips(worker.heartbeat) == 1
    assert conn.hget(worker.key, "state") == b"idle"
    assert round_trips(worker.heartbeat) == 0
    # An unchanged state is never sent again, so a worker key that expired (and that a
    # heartbeat makes anew) gets it back from the heartbeat.
    conn.delete(worker.key)
    worker.heartbeat(600)
    assert conn.hget(worker.key, "state") == b"idle"
    job = CodepoolJob.create(JOB_FUNCTION, connection=conn, serializer=MsgpackSerializer)
    assert round_trips(lambda: worker.handle_execution_ended(job, queue, 60)) == 0
    assert job.ended_at is not None
    conn.close()


def test_a_job_is_readied_in_one_round_trip_and_its_end_beats_once(redis_url: str) -> None:
    conn, queue, worker = _counted(redis_url, "readied")
    worker.register_birth()
    job = queue.enqueue_call(JOB_FUNCTION, args=(b"announcement",))
    # As RQ's dequeue leaves it: on the intermediate list until the job is readied.
    conn.lmove(queue.key, queue.intermediate_queue_key)
    executions: list[Any] = []
    assert round_trips(lambda: executions.append(worker.prepare_execution(job))) == 1
    assert round_trips(lambda: worker.prepare_job_execution(job, True)) == 0
    # Redis holds what RQ's two round trips would have left.
    assert conn.hget(job.key, "status") == b"started"
    assert conn.hget(worker.key, "state") == b"busy"
    assert job.id in queue.started_job_registry.get_job_ids()
    assert conn.lrange(queue.intermediate_queue_key, 0, -1) == []
    assert conn.ttl(job.key) == -1  # persisted while it runs
    assert conn.exists(executions[0].key)
    # A job that prepare_execution did not ready is readied as RQ does it.
    other = queue.enqueue_call(JOB_FUNCTION, args=(b"another",))
    assert round_trips(lambda: worker.prepare_job_execution(other, False)) == 1
    assert conn.hget(other.key, "status") == b"started"
    # After a job, RQ's own heartbeat waits for the suspension check's, which says IDLE.
    worker.set_state(WorkerStatus.IDLE)
    worker._beat_rides_next = True
    assert round_trips(worker.heartbeat) == 0
    assert round_trips(lambda: is_suspended(conn, worker)) == 1
    assert conn.hget(worker.key, "state") == b"idle"
    conn.close()
