"""Lone calls across a Redis outage (docs/chaos.md, finding 8): a host whose reply could
not be written while Redis was away writes it once Redis is back, so the call ends with
its result, not at its deadline minutes later; a call past its deadline is withdrawn
from the call list. Real redis-server (AOF, restarted), real `codepool worker`."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import redis

from codepool.common.keys import Keys
from codepool.common.limits import Limits
from codepool.common.result import ExecResult
from codepool.ops.redis_server import RedisServer
from codepool.producer import CodePool, RemoteSandbox
from tests.conftest import StartWorker, wait_for_dispatchers, wait_until


@pytest.fixture
def aof_redis() -> Iterator[RedisServer]:
    with RedisServer(appendonly=True) as server:
        yield server


def test_a_reply_written_while_redis_is_away_still_arrives(
    aof_redis: RedisServer, start_worker: StartWorker
) -> None:
    # Failed before the fix: the host's writer logged "lone call replies lost" and
    # dropped the reply; the call stayed on the host's in-flight list (put back on the
    # call list only when the host stopped) and its caller waited until the call's
    # deadline (its timeout + 300 s).
    worker = start_worker(url=aof_redis.url, wait=False)
    wait_for_dispatchers(aof_redis.url, worker.name, worker)
    client = redis.Redis.from_url(aof_redis.url)
    keys = Keys()
    got: list[ExecResult] = []
    with RemoteSandbox(aof_redis.url, timeout=10.0) as sandbox:
        assert sandbox.run_code("print(1)").stdout == "1\n"
        caller = threading.Thread(
            target=lambda: got.append(
                sandbox.run_code("import time\ntime.sleep(3.5)\nprint('after')")
            ),
            daemon=True,
        )
        caller.start()

        def taken() -> bool:
            return client.llen(keys.calls()) == 0 and any(
                client.llen(key) for key in client.scan_iter(keys.host_calls("*"))
            )

        wait_until(taken, timeout_s=20, what="the call taken by the host")
        time.sleep(1.5)  # past the push's own wait (run's pipeline: RPUSH, BLPOP 1 s)
        aof_redis.stop()  # down until well after the call ends: its reply cannot go
        time.sleep(5.0)
        aof_redis.start()
        client = redis.Redis.from_url(aof_redis.url)
        caller.join(timeout=30)
        assert not caller.is_alive(), "the call never came back"
        assert [(r.status, r.stdout) for r in got] == [("ok", "after\n")], got
        wait_until(
            lambda: not any(client.llen(k) for k in client.scan_iter(keys.host_calls("*"))),
            timeout_s=10,
            what="the host's in-flight list emptied",
        )
    client.close()


def test_a_lone_call_past_its_deadline_is_withdrawn(redis_url: str) -> None:
    # Failed before: the caller got infra at the deadline, but the call stayed queued
    # on the call list, to run later for nobody (the chaos run's finding 8).
    client = redis.Redis.from_url(redis_url)
    calls_key = Keys().calls()
    pool = CodePool(redis_url)
    try:
        started = time.monotonic()
        future = pool.calls.submit("print('late')", Limits(), deadline_s=1.5)  # no worker
        result = future.result(timeout=20)
        assert result.status == "infra" and "deadline" in result.stderr, result
        assert time.monotonic() - started < 10
        wait_until(lambda: client.llen(calls_key) == 0, timeout_s=5, what="the call withdrawn")
    finally:
        pool.close()
        client.close()
