"""Giving up, end to end: real redis-server, real `codepool worker` processes. A caller
that gives up (asyncio cancellation, directly or by wait_for; a cancelled submit future;
Batch.cancel; a closed sandbox or pool; a producer killed -9) frees its slots: what had
not started never starts, what ran is killed and its slot serves another snippet within
KILLED_WITHIN_S (a dead producer's: within its lease and a janitor's round), none of it
is written, all of it is counted as cancelled, and batch mates are untouched."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis
from rq import Queue
from rq.job import Job

from codepool.common import codec
from codepool.common.cancellation import CLOSED_MESSAGE, PRODUCER_LOST_MESSAGE
from codepool.common.codec import MsgpackSerializer
from codepool.common.result import ExecResult
from codepool.common.settings import Settings
from codepool.ops.redis_server import RedisServer
from codepool.producer import CodePool, RemoteSandbox
from codepool.producer.lease import ProducerLease
from codepool.producer.pool import CLOSE_TIMEOUT_S
from codepool.worker.lease import JANITOR_SPREAD, janitor_period_s
from tests.conftest import (
    KILLED_WITHIN_S,
    StartWorker,
    sleeping_below,
    sleeping_pids,
    wait_until,
)
from tests.processes import still_running

SLEEPER = "import time\ntime.sleep(120)"


@contextmanager
def watching_sleepers(pid: int) -> Iterator[set[int]]:
    """Every sleeping snippet seen below ``pid`` while the block runs (polled): a snippet
    given up on before it started must never show up here."""
    seen: set[int] = set(sleeping_pids(pid))
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen.update(sleeping_pids(pid))
            stop.wait(0.01)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join()


def counted(redis_url: str, run: str) -> dict[str, int]:
    pool = CodePool(redis_url)
    try:
        return pool.counters(run=run)
    finally:
        pool.close()


def stored(redis_url: str, batch_id: str) -> dict[int, tuple[str, str]]:
    """The batch's results hash: index -> (status, stderr)."""
    client = redis.Redis.from_url(redis_url)
    key = Settings.from_env(redis_url=redis_url).keys.batch_results(batch_id)
    out = {}
    for index, blob in client.hgetall(key).items():
        result = codec.decode_result(blob)
        out[int(index)] = (result.status, result.stderr)
    client.close()
    return out


def test_a_caller_giving_up_spoils_no_batch_mate(redis_url: str, start_worker: StartWorker) -> None:
    start_worker(concurrency=2)
    with RemoteSandbox(redis_url, timeout=30.0, run="mates", linger_s=0.05, lone=False) as sandbox:

        async def main() -> list[object]:
            # A call in flight, so the next ones are coalesced into one batch.
            blocker = asyncio.ensure_future(sandbox.arun_code("import time\ntime.sleep(0.2)"))
            while sandbox._in_flight == 0:
                await asyncio.sleep(0.001)
            # First in the batch: it would end (at 0.4 s) while its mates still wait.
            late = asyncio.ensure_future(
                sandbox.arun_code("import time\ntime.sleep(0.4)\nprint('late')")
            )
            mates = [
                sandbox.arun_code(f"import time\ntime.sleep(0.3)\nprint({i})") for i in range(7)
            ]
            given_up = asyncio.wait_for(late, 0.1)
            return await asyncio.gather(given_up, *mates, blocker, return_exceptions=True)

        gave_up, *results, blocker = asyncio.run(main())
    assert isinstance(gave_up, TimeoutError)
    outcomes = [(r.status, r.stdout, r.stderr[-200:]) for r in results]  # type: ignore[attr-defined]
    assert outcomes == [("ok", f"{i}\n", "") for i in range(7)]
    assert blocker.ok  # type: ignore[attr-defined]
    got = counted(redis_url, "mates")
    assert (got["calls"], got["ok"], got["cancelled"]) == (8, 8, 1), got
    assert got.get("infra", 0) == got.get("error", 0) == 0


# Batch mates of a sleeper given up on, and what each must print.
MATES = [f"print({i} * 7)" for i in range(6)]
MATE_OUTPUTS = [("ok", f"{i * 7}\n", "") for i in range(6)]


def sleepers_hold_both_slots(sandbox: RemoteSandbox, pid: int) -> dict[int, int]:
    """Once two sleepers run (one alone in its batch, one first in a batch with the
    mates): their pids. Two batches in flight, and no mate done yet (the caller looks),
    say that the mates share the second sleeper's batch and can run only in a slot a
    kill frees."""
    wait_until(lambda: sleeping_below(pid) == 2, what="both sleepers running")
    assert len(sandbox.pool.lease.in_flight()) == 2
    return sleeping_pids(pid)


def mates_ran_and_sleepers_died(
    redis_url: str, run: str, results: list[ExecResult], running: dict[int, int]
) -> None:
    """The mates' results are theirs, both sleepers are killed, and the run counts the
    mates as calls and the sleepers as cancelled."""
    assert [(r.status, r.stdout, r.stderr) for r in results] == MATE_OUTPUTS
    wait_until(lambda: not still_running(running), KILLED_WITHIN_S, what="both sleepers killed")
    got = counted(redis_url, run)
    assert (got["calls"], got["ok"], got["cancelled"]) == (6, 6, 2), got


def test_a_task_cancelled_directly_frees_its_slot_and_spoils_no_batch_mate(
    redis_url: str, start_worker: StartWorker
) -> None:
    pid = start_worker(concurrency=2).process.pid
    with RemoteSandbox(redis_url, timeout=300.0, run="task", linger_s=0.2, lone=False) as sandbox:

        async def main() -> tuple[list[ExecResult], dict[int, int]]:
            alone = asyncio.create_task(sandbox.arun_code(SLEEPER))
            # While it is in flight the next calls linger for each other: one batch.
            in_flight = sandbox.pool.lease.in_flight
            await asyncio.to_thread(wait_until, lambda: len(in_flight()) == 1)
            ahead = asyncio.create_task(sandbox.arun_code(SLEEPER))  # of its mates
            mates = [asyncio.create_task(sandbox.arun_code(code)) for code in MATES]
            running = await asyncio.to_thread(sleepers_hold_both_slots, sandbox, pid)
            assert not any(mate.done() for mate in mates)
            alone.cancel()
            ahead.cancel()
            _, late = await asyncio.wait(mates, timeout=KILLED_WITHIN_S)
            assert not late, "the batch mates did not get the freed slots in time"
            for task in (alone, ahead):
                with pytest.raises(asyncio.CancelledError):
                    await task
            return [mate.result() for mate in mates], running

        results, running = asyncio.run(main())
    mates_ran_and_sleepers_died(redis_url, "task", results, running)


def test_a_cancelled_submit_future_frees_its_slot_and_spoils_no_batch_mate(
    redis_url: str, start_worker: StartWorker
) -> None:
    pid = start_worker(concurrency=2).process.pid
    with RemoteSandbox(redis_url, timeout=300.0, run="future", linger_s=0.2, lone=False) as sandbox:
        alone = sandbox.submit(SLEEPER)
        wait_until(lambda: len(sandbox.pool.lease.in_flight()) == 1, what="its batch out")
        ahead = sandbox.submit(SLEEPER)  # of its mates
        mates = [sandbox.submit(code) for code in MATES]
        running = sleepers_hold_both_slots(sandbox, pid)
        assert not any(mate.done() for mate in mates)
        assert alone.cancel() and ahead.cancel()
        _, late = futures.wait(mates, timeout=KILLED_WITHIN_S)
        assert not late, "the batch mates did not get the freed slots in time"
        results = [mate.result() for mate in mates]
    mates_ran_and_sleepers_died(redis_url, "future", results, running)


def test_batch_cancel_kills_what_runs_and_starts_nothing_more(
    redis_url: str, start_worker: StartWorker
) -> None:
    worker = start_worker(concurrency=2)
    pool = CodePool(redis_url)
    batch = pool.submit([SLEEPER] * 6, timeout_s=300, run="gave-up")
    wait_until(lambda: sleeping_below(worker.process.pid) == 2, what="two snippets running")
    running = sleeping_pids(worker.process.pid)
    with watching_sleepers(worker.process.pid) as seen:
        assert batch.cancel() == 6
        # Both slots are free within the bound: a following snippet has run in one (it
        # comes back infra if not), and the two that ran are gone.
        after = pool.submit(["print('next')"], run="after").results(timeout_s=KILLED_WITHIN_S)
        wait_until(lambda: not still_running(running), KILLED_WITHIN_S, what="both killed")
        results = batch.results(timeout_s=60)
    assert [(r.status, r.stdout) for r in after] == [("ok", "next\n")], after
    assert [r.status for r in results] == ["cancelled"] * 6
    assert len(seen) == 2, "a snippet given up on before it started ran"
    # Nothing of theirs was written: each index holds its cancellation, counted once.
    assert {status for status, _ in stored(redis_url, batch.id).values()} == {"cancelled"}
    got = counted(redis_url, "gave-up")
    assert (got.get("calls", 0), got["cancelled"]) == (0, 6), got
    assert batch.cancel() == 0
    pool.close()


def test_cancelling_some_snippets_leaves_their_batch_mates_alone(
    redis_url: str, start_worker: StartWorker
) -> None:
    worker = start_worker(concurrency=2)
    pool = CodePool(redis_url)
    codes = [SLEEPER, SLEEPER] + [f"print({i})" for i in range(2, 6)] + [SLEEPER]
    batch = pool.submit(codes, timeout_s=300, run="some")
    wait_until(lambda: sleeping_below(worker.process.pid) == 2, what="two snippets running")
    with watching_sleepers(worker.process.pid) as seen:
        assert asyncio.run(batch.acancel([0, 1, 6])) == 3
        results = batch.results(timeout_s=60)
    outcomes = [(r.status, r.stdout) for r in results]
    assert outcomes == [("cancelled", "")] * 2 + [("ok", f"{i}\n") for i in range(2, 6)] + [
        ("cancelled", "")
    ]
    assert len(seen) == 2  # the queued sleeper never started
    got = counted(redis_url, "some")
    assert (got["calls"], got["ok"], got["cancelled"]) == (4, 4, 3), got
    pool.close()


def test_closing_a_sandbox_or_a_pool_gives_up_on_what_is_in_flight(
    redis_url: str, start_worker: StartWorker
) -> None:
    worker = start_worker(concurrency=2)
    sandbox = RemoteSandbox(redis_url, timeout=300.0, run="closed")
    futures = [sandbox.submit(SLEEPER) for _ in range(3)]
    wait_until(lambda: sleeping_below(worker.process.pid) == 2, what="two snippets running")
    sandbox.close()
    results = [future.result(timeout=60) for future in futures]
    assert [(r.status, r.stderr) for r in results] == [("cancelled", CLOSED_MESSAGE)] * 3
    wait_until(lambda: sleeping_below(worker.process.pid) == 0, KILLED_WITHIN_S, what="both killed")
    pool = CodePool(redis_url)
    batch = pool.submit([SLEEPER] * 3, timeout_s=300, run="closed")
    wait_until(lambda: sleeping_below(worker.process.pid) == 2, what="two snippets running")
    pool.close()
    wait_until(lambda: sleeping_below(worker.process.pid) == 0, KILLED_WITHIN_S, what="both killed")
    assert {status for status, _ in stored(redis_url, batch.id).values()} == {"cancelled"}
    got = counted(redis_url, "closed")
    assert (got.get("calls", 0), got["cancelled"]) == (0, 6), got


PRODUCER = """
import sys
from codepool.producer import CodePool

pool = CodePool(sys.argv[1])
batch = pool.submit([{code!r}] * 6, timeout_s=300, run="orphan")
print(batch.id, flush=True)
batch.results()
"""


def test_a_killed_producers_batch_is_cancelled_within_its_lease(
    redis_url: str, start_worker: StartWorker, tmp_path: Path
) -> None:
    lease = {"CODEPOOL_LEASE_S": "3"}  # producers and workers agree on it
    settings = Settings.from_env(lease)
    # The dead producer's lease lapses at most lease_s after its death (its last beat
    # came before); the lone worker host's next janitor's round comes at most a spread
    # janitor period after that, at one of its beats; the kill then takes what any
    # cancellation takes. 13.5 s here, against the 30 s the snippets' timeout would take.
    cancelled_within_s = (
        settings.lease_s
        + JANITOR_SPREAD[1] * janitor_period_s(settings, live_hosts=1)
        + settings.heartbeat_s
        + KILLED_WITHIN_S
    )
    worker = start_worker(concurrency=2, env=lease)
    script = tmp_path / "producer.py"
    script.write_text(PRODUCER.format(code=SLEEPER))
    producer = subprocess.Popen(
        [sys.executable, str(script), redis_url],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **lease},
    )
    assert producer.stdout is not None
    batch_id = producer.stdout.readline().strip()
    wait_until(lambda: sleeping_below(worker.process.pid) == 2, what="two snippets running")
    running = sleeping_pids(worker.process.pid)
    with watching_sleepers(worker.process.pid) as seen:
        producer.kill()
        producer.wait()
        wait_until(
            lambda: not still_running(running),
            timeout_s=cancelled_within_s,
            what="its running snippets killed once its lease lapsed",
        )
    assert len(seen) == 2, "a snippet of the dead producer's started after it died"
    assert stored(redis_url, batch_id) == {
        i: ("cancelled", PRODUCER_LOST_MESSAGE) for i in range(6)
    }
    got = counted(redis_url, "orphan")
    assert (got.get("calls", 0), got["cancelled"]) == (0, 6), got
    assert "lapsed; cancelled its 1 batches in flight" in worker.log()


def test_a_batch_given_up_leaves_no_announcement_on_the_queue(redis_url: str) -> None:
    # No worker: the announcements stay queued until the batch is given up on.
    client = redis.Redis.from_url(redis_url)
    queue = Queue("codepool", connection=client, serializer=MsgpackSerializer)
    pool = CodePool(redis_url)
    kept, dropped = pool.submit(["print(1)"] * 4), pool.submit(["print(2)"] * 4)
    assert {job.rsplit("-", 1)[0] for job in queue.job_ids} == {kept.id, dropped.id}
    assert kept.cancel([0, 1]) == 2  # some of it is still wanted: announced still
    assert dropped.cancel([0, 1]) == 2 and dropped.cancel([2, 3]) == 2
    assert {job.rsplit("-", 1)[0] for job in queue.job_ids} == {kept.id}
    assert not any(client.exists(Job.key_for(job)) for job in dropped.announcements)
    assert {r.status for r in dropped.results(timeout_s=5)} == {"cancelled"}
    pool.close()


def test_a_close_does_not_wait_for_a_frozen_redis() -> None:
    # Giving up on close needs Redis; a Redis that is frozen (what a dead host or a cut
    # link looks like) gets one short try, and the lease is left to lapse.
    with RedisServer() as server:
        assert server.process is not None
        pool = CodePool(server.url)
        pool.submit([SLEEPER] * 3)  # no worker: in flight, for good
        sandbox = RemoteSandbox(server.url, timeout=300.0)
        call = sandbox.submit(SLEEPER)
        wait_until(lambda: bool(sandbox.pool.lease.in_flight()), what="the call in a batch")
        os.kill(server.process.pid, signal.SIGSTOP)
        try:
            closing = [threading.Thread(target=pool.close), threading.Thread(target=sandbox.close)]
            # The one try (CLOSE_TIMEOUT_S) and a margin for a loaded machine: far below
            # the socket timeout (30 s) an unbounded close waits, and below the try plus
            # the 5 s join of the lease thread, which sits in a beat on the frozen Redis.
            ends = time.monotonic() + CLOSE_TIMEOUT_S + 2.5
            for thread in closing:
                thread.start()
            for thread in closing:
                thread.join(timeout=max(0.0, ends - time.monotonic()))
            assert not any(thread.is_alive() for thread in closing), "a close waited for Redis"
            assert call.result(timeout=5).status == "cancelled"
        finally:
            os.kill(server.process.pid, signal.SIGCONT)


def test_a_lease_whose_redis_is_gone_says_so_once_then_says_it_is_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A producer beats every second: with its Redis gone, one warning (and one a minute
    while it lasts), not one a beat; and a line when the beats go through again."""
    server = RedisServer().start()
    try:
        lease = ProducerLease(
            redis.Redis.from_url(server.url), Settings(redis_url=server.url), name="p"
        )
        lease.stop()  # no thread: beats by hand only
        lease.submitted("b1", "run")
        server.stop(kill=True)
        with caplog.at_level(logging.INFO, logger="codepool.producer.lease"):
            for _ in range(5):
                lease.beat()
            server.start()
            lease.beat()
        said = [record.getMessage() for record in caplog.records]
        assert [line for line in said if "heartbeat failed" in line] == [said[0]], said
        assert len(said) == 2 and "heartbeat back after" in said[1], said
    finally:
        server.close()
