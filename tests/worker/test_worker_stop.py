"""A SIGTERM ends ``codepool worker`` within its drain deadline: what runs finishes, or
is stopped at the deadline and given back; the batch's other snippets complete
exactly once on another worker; and a worker whose Redis is gone (killed, or frozen as
behind a cut link) exits all the same. Real workers and Redis servers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from codepool.common.settings import DEFAULT_DRAIN_S, Settings
from codepool.ops.redis_server import RedisServer
from codepool.producer import CodePool
from tests.conftest import (
    StartWorker,
    WorkerProcess,
    sleeping_below,
    wait_for_dispatchers,
    wait_until,
)
from tests.processes import still_running, tree

# Beyond the drain deadline: the interpreter's own exit and a loaded machine's
# scheduling, not work of the worker's (nothing it does waits past the deadline).
MARGIN_S = 2.5
# The deadline the orphaned workers below are given (the flag obeyed); the mid-batch
# test keeps the default a user gets (DEFAULT_DRAIN_S).
DRAIN_S = 3.0


def running_snippets(pid: int) -> int:
    """Snippets running below worker ``pid``: processes in a PID namespace of their own
    that burn CPU (the waiting children sleep on their request socket)."""
    count = 0
    for member in tree(pid):
        try:
            with open(f"/proc/{member}/status") as f:
                status = f.read()
        except OSError:
            continue
        nspid = next(line for line in status.splitlines() if line.startswith("NSpid:"))
        state = next(line for line in status.splitlines() if line.startswith("State:"))
        count += len(nspid.split()) > 2 and "R (running)" in state
    return count


def test_sigterm_mid_batch_cuts_at_the_deadline_and_the_rest_runs_once_elsewhere(
    redis_url: str, start_worker: StartWorker
) -> None:
    first = start_worker(concurrency=2, name="first")
    pool = CodePool(redis_url)
    codes = [
        "import time\ntime.sleep(3)\nprint('finished in the drain')",  # runs on, ends
        "import time\ntime.sleep(600)\nprint('never')",  # still running at the deadline
        *[f"print({i})" for i in range(2, 8)],  # waiting, claimed or not: given back
    ]
    batch = pool.submit(codes, timeout_s=120)
    client = redis.Redis.from_url(redis_url)
    state = Settings.from_env(redis_url=redis_url).keys.batch_state(batch.id)
    wait_until(lambda: int(client.hget(state, "next") or 0) > 0, what="the first claim")
    wait_until(lambda: sleeping_below(first.process.pid) >= 2, what="both snippets running")
    by = time.monotonic() + DEFAULT_DRAIN_S + MARGIN_S
    started = time.monotonic()
    first.process.send_signal(signal.SIGTERM)
    assert first.process.wait(timeout=by - time.monotonic()) == 0, first.log()
    assert time.monotonic() - started < DEFAULT_DRAIN_S + MARGIN_S
    # The re-run of the long one times out there at once: the second worker's ceiling.
    start_worker("--max-timeout", "2", concurrency=2, name="second")
    results = batch.results(timeout_s=120)
    outcome = [(r.status, r.worker, r.stdout) for r in results]
    assert outcome[0] == ("ok", "first", "finished in the drain\n"), outcome
    assert outcome[1][:2] == ("timeout", "second"), outcome  # cut, given back, run again
    assert outcome[2:] == [("ok", "second", f"{i}\n") for i in range(2, 8)], outcome
    # Exactly once: one done-list entry and one count per snippet, whoever ran it.
    assert batch.duplicates == 0
    stats = Settings.from_env(redis_url=redis_url).keys.stats()
    assert int(client.hget(stats, "calls") or 0) == len(codes)
    assert "drain deadline: taking back all of its 1 snippets" in first.log()
    client.close()


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A Redis server this test may kill or freeze."""
    server = RedisServer().start()
    try:
        yield server
    finally:
        if server.process is not None:
            server.process.send_signal(signal.SIGCONT)
        server.close()


@pytest.mark.parametrize("how", ["killed", "frozen"])
def test_a_busy_worker_whose_redis_is_gone_exits_on_sigterm(
    own_redis: RedisServer, tmp_path: Path, how: str
) -> None:
    """Killed, the server refuses every connection at once; frozen (SIGSTOP), it is what
    a dead host or a cut link looks like: connections that are never answered, where
    every Redis call waits out its timeout and retries."""
    log_path = str(tmp_path / "worker.log")
    with open(log_path, "wb") as log:
        command = [sys.executable, "-m", "codepool.ops.cli", "worker", "-c", "2", "--preload", ""]
        process = subprocess.Popen(
            [*command, "--drain-timeout", str(DRAIN_S), "--name", "orphan", "--url", own_redis.url],
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
        )
    worker = WorkerProcess("orphan", process, log_path)
    snapshot: dict[int, int] = {}
    try:
        wait_for_dispatchers(own_redis.url, "orphan", worker)
        CodePool(own_redis.url).submit(["while True: pass"] * 6, timeout_s=60)
        wait_until(lambda: running_snippets(process.pid) == 2, what="both slots busy")
        snapshot = tree(process.pid)
        assert own_redis.process is not None
        if how == "killed":
            own_redis.stop(kill=True)
        else:  # as behind a cut link: connections open, nothing answers
            own_redis.process.send_signal(signal.SIGSTOP)
        by = time.monotonic() + DRAIN_S + MARGIN_S
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=by - time.monotonic()) == 0, worker.log()
        assert time.monotonic() - started < DRAIN_S + MARGIN_S
        wait_until(
            lambda: not still_running(snapshot),
            timeout_s=max(0.1, by - time.monotonic()),
            what="the worker's processes gone",
        )
    finally:
        snapshot.update(tree(process.pid))
        for pid in still_running(snapshot):
            os.kill(pid, signal.SIGKILL)
        process.wait(timeout=30)
