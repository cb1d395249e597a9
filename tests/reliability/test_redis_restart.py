"""Redis restarts (AOF everysec) during a run: producers and workers reconnect and the
run completes; Redis down past the producer's deadline gives infra results, not a hang."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from codepool.common.limits import Limits
from codepool.ops.redis_server import RedisServer
from codepool.producer import CodePool
from codepool.producer.pool import Batch
from tests.conftest import StartWorker, wait_for_dispatchers, wait_until


@pytest.fixture
def aof_redis() -> Iterator[RedisServer]:
    with RedisServer(appendonly=True) as server:
        yield server


def _on_disk(server: RedisServer, needle: bytes) -> bool:
    """True once the server's append-only files (one dir of them since Redis 7, one file
    before) hold ``needle``."""
    found = False
    for root, _, files in os.walk(server.dir):
        for name in files:
            if "appendonly" in name or root.endswith("appendonlydir"):
                with open(os.path.join(root, name), "rb") as f:
                    found = found or needle in f.read()
    return found


def test_run_completes_across_a_redis_restart(
    aof_redis: RedisServer, start_worker: StartWorker
) -> None:
    worker = start_worker(url=aof_redis.url, wait=False)
    wait_for_dispatchers(aof_redis.url, worker.name, worker)
    pool = CodePool(aof_redis.url)
    n = 30
    batch = pool.submit(
        [f"import time\ntime.sleep(0.1)\nprint({i})" for i in range(n)], deadline_s=20.0
    )
    wait_until(lambda: _on_disk(aof_redis, batch.id.encode()), what="the batch in the AOF")
    aof_redis.restart()
    results = batch.results(timeout_s=90)
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(n)]
    assert pool.submit(["print('after')"]).results(timeout_s=60)[0].stdout == "after\n"
    # The writes (and the counting in them) rode it out too: every snippet is counted,
    # none twice.
    wait_until(lambda: pool.counters().get("calls", 0) >= n + 1, what="all counted")
    assert pool.counters().get("calls") == n + 1 and pool.counters().get("ok") == n + 1
    assert worker.process.poll() is None


def test_redis_down_past_the_deadline_gives_infra_promptly(aof_redis: RedisServer) -> None:
    pool = CodePool(aof_redis.url)
    batch = pool.submit(["print(1)"] * 3)  # no worker: nothing will answer
    aof_redis.stop()
    try:
        started = time.monotonic()
        results = Batch(pool, batch.id, 3, Limits(), deadline_s=2.0).results(timeout_s=3.0)
        assert time.monotonic() - started < 8
        assert [r.status for r in results] == ["infra"] * 3
    finally:
        aof_redis.start()
