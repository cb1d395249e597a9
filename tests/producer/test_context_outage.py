"""A remote context across a Redis outage: its call rides out a restart as a batch does,
and a request sent twice (its push's reply lost) runs once. Real redis-server (AOF),
real worker host."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import redis

from codepool.common.context_requests import ContextRequest
from codepool.common.result import ExecResult
from codepool.common.settings import Settings
from codepool.ops.redis_server import RedisServer
from codepool.producer import CodePool
from tests.conftest import StartWorker, wait_for_dispatchers, wait_until


@pytest.fixture
def aof_redis() -> Iterator[RedisServer]:
    with RedisServer(appendonly=True) as server:
        yield server


def test_a_context_call_rides_out_a_redis_restart(
    aof_redis: RedisServer, start_worker: StartWorker
) -> None:
    # Failed before the fix: run_code raised ConnectionError (BusyLoadingError while
    # the AOF loads) after redis-py's three short retries.
    worker = start_worker(url=aof_redis.url, wait=False)
    wait_for_dispatchers(aof_redis.url, worker.name, worker)
    pool = CodePool(aof_redis.url)
    ctx = pool.context(timeout_s=10.0)
    assert ctx.run_code("n = 41").ok
    aof_redis.stop()
    got: list[ExecResult | BaseException] = []

    def call() -> None:
        try:
            got.append(ctx.run_code("n += 1\nprint(n)"))
        except BaseException as exc:  # what the caller would have met
            got.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    try:
        # The call meets the outage, and keeps meeting it for a while.
        wait_until(lambda: caller.is_alive() and not got, 2.0, what="the call waiting")
        caller.join(timeout=1.5)
        assert caller.is_alive(), f"the call gave up on a Redis that was down: {got}"
    finally:
        aof_redis.start()
    caller.join(timeout=60)
    assert len(got) == 1
    result = got[0]
    assert isinstance(result, ExecResult), repr(result)
    assert (result.status, result.stdout) == ("ok", "42\n"), result
    assert ctx.run_code("print(n)").stdout == "42\n"  # ran once, state kept
    assert worker.process.poll() is None
    ctx.close()
    pool.close()


def test_a_context_request_sent_twice_runs_once(redis_url: str, start_worker: StartWorker) -> None:
    # Failed before the fix: the host ran both copies (a push retried after its reply
    # was lost would run a call twice).
    start_worker()
    pool = CodePool(redis_url)
    ctx = pool.context(timeout_s=10.0)
    assert ctx.run_code("n = 0").ok
    keys = Settings.from_env(redis_url=redis_url).keys
    client = redis.Redis.from_url(redis_url)
    request = ContextRequest("run", ctx.id, code="n += 1", limits={})
    client.rpush(keys.host_requests(ctx.host), request.encode(), request.encode())
    reply_key = keys.context_reply(request.id)
    wait_until(lambda: bool(client.llen(reply_key)), what="the request answered")
    assert ctx.run_code("print(n)").stdout == "1\n"
    assert client.llen(reply_key) == 1
    client.close()
    ctx.close()
    pool.close()
