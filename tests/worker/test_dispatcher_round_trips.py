"""RQ's per-job bookkeeping in a dispatcher costs few round trips: a worker heartbeat is
one pipeline, and a state RQ sets twice in a row is sent once; Redis holds the same."""

from __future__ import annotations

from typing import Any

import redis
from rq import Queue
from rq.worker import WorkerStatus

from codepool.common.codec import MsgpackSerializer
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
    assert round_trips(lambda: worker.set_state(WorkerStatus.IDLE)) == 1
    assert round_trips(lambda: worker.set_state(WorkerStatus.IDLE)) == 0
    assert conn.hget(worker.key, "state") == b"idle"
    assert round_trips(lambda: worker.set_state(WorkerStatus.BUSY)) == 1
    assert round_trips(lambda: worker.set_state(WorkerStatus.IDLE)) == 1
    assert conn.hget(worker.key, "state") == b"idle"
    conn.close()
