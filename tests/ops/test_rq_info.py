"""RQ's own monitor, `rq info`, shows codepool's queue and a worker's dispatchers.

rq 3.0 ships ``rq/cli/__main__.py``, so ``python -m rq.cli`` is the same command as the
``rq`` console script. ``rq info`` counts jobs and reads worker hashes without
deserializing any job, so codepool's msgpack serializer does not get in its way (and
``--serializer codepool.common.codec.MsgpackSerializer`` is accepted too).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import redis
from rq import Worker

from codepool.common.settings import Settings
from codepool.producer import CodePool
from tests.conftest import WorkerProcess

QUEUE = Settings().queue


def rq_info(url: str, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "rq.cli", "info", "--url", url, *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def dispatchers_of(url: str, name: str) -> list[str]:
    client = redis.Redis.from_url(url)
    try:
        return sorted(w.name for w in Worker.all(connection=client) if w.name.startswith(name))
    finally:
        client.close()


def test_rq_info_lists_queue_and_dispatchers(
    redis_url: str, start_worker: Callable[..., WorkerProcess]
) -> None:
    start_worker(name="rqinfo")
    dispatchers = dispatchers_of(redis_url, "rqinfo.")
    assert len(dispatchers) >= 2

    # RQ registers a queue (rq:queues) at its first enqueue: before that, only a queue
    # named on the command line is shown.
    assert f"{QUEUE} " in rq_info(redis_url, QUEUE)
    results = CodePool(redis_url).submit(["print(1)"]).results(timeout_s=30)
    assert results[0].status == "ok", results

    for args in ((), ("--serializer", "codepool.common.codec.MsgpackSerializer")):
        out = rq_info(redis_url, *args)
        lines = out.splitlines()
        assert any(line.startswith(f"{QUEUE} ") and "1 finished" in line for line in lines), out
        for dispatcher in dispatchers:
            assert any(line.startswith(dispatcher + " ") for line in lines), (dispatcher, out)
        assert f"{len(dispatchers)} workers, 1 queues" in out, out

    by_queue = rq_info(redis_url, "--by-queue")
    assert any(
        line.startswith(f"{QUEUE}:") and all(d in line for d in dispatchers)
        for line in by_queue.splitlines()
    ), by_queue


def test_rq_info_shows_busy_dispatchers(
    redis_url: str, start_worker: Callable[..., WorkerProcess]
) -> None:
    start_worker(name="rqbusy")
    pool = CodePool(redis_url)
    batches = [pool.submit(["import time; time.sleep(3)"]) for _ in range(3)]
    try:
        out = ""
        for _ in range(40):
            out = rq_info(redis_url)
            if "busy" in out:
                break
        assert "busy" in out and "executing" in out, out
    finally:
        for batch in batches:
            assert batch.results(timeout_s=60)[0].status == "ok"
