"""RQ's per-job bookkeeping in a dispatcher costs few round trips: a worker heartbeat is
one pipeline (the worker's state in it) and is not repeated within ten seconds, a state
RQ sets again unchanged is not sent, IDLE rides with the next heartbeat, and the job
heartbeat RQ sends for callbacks codepool never has is not sent; Redis holds the same."""

from __future__ import annotations

from typing import Any

import redis
from rq import Queue
from rq.worker import WorkerStatus

from codepool.common.codec import MsgpackSerializer
from codepool.common.wire import JOB_FUNCTION
from codepool.worker.dispatcher import Dispatcher
from codepool.worker.job import CodepoolJob


class CountingConnection(redis.connection.Connection):
    """A real connection that counts what it sends: one send per round trip."""

    sends = 0

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        CountingConnection.sends += 1
        super().send_packed_command(command, check_health)


def test_heartbeats_and_repeated_states_cost_one_round_trip(redis_url: str) -> None:
    pool = redis.ConnectionPool.from_url(redis_url, connection_class=CountingConnection)
    conn = redis.Redis(connection_pool=pool)
    queue = Queue("codepool", connection=conn, serializer=MsgpackSerializer)
    worker = Dispatcher(
        [queue],
        connection=conn,
        name="counted",
        serializer=MsgpackSerializer,
        job_class=CodepoolJob,
    )
    conn.ping()

    def round_trips(action: Any) -> int:
        before = CountingConnection.sends
        action()
        return CountingConnection.sends - before

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
