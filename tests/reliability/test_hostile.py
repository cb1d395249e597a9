"""Hostile snippets through the queue, against a real worker: nothing leaks, nothing is
left running, and the worker's snippets run as fast afterwards as before."""

from __future__ import annotations

import statistics
from urllib.parse import urlparse

from codepool.common.result import ExecResult
from codepool.ops.bench.process_tree import descendants
from codepool.producer import CodePool
from tests.conftest import ROOT, StartWorker, wait_until
from tests.hostile import HOSTILE, check


def _exec_ms(pool: CodePool, n: int = 40) -> float:
    """Median time a plain snippet spends in its child: what a leftover process, a full
    /tmp or a damaged zygote would slow down, and far steadier on a shared machine than
    a batch's wall time."""
    results = pool.submit(["print(2 + 3)"] * n).results(timeout_s=60)
    assert all(r.stdout == "5\n" for r in results)
    return statistics.median(r.exec_s for r in results) * 1000


def test_hostile_snippets_change_nothing(redis_url: str, start_worker: StartWorker) -> None:
    worker = start_worker(concurrency=2, env={"CODEPOOL_TEST_SECRET": "hunter2"})
    pool = CodePool(redis_url)
    port = urlparse(redis_url).port
    baseline_processes = len(descendants(worker.process.pid))
    before = _exec_ms(pool)
    hostile = {
        "redis": f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), 2)\n"
        "    print('REACHED')\nexcept OSError:\n    print('blocked')",
        **HOSTILE,
    }
    # Without root every snippet keeps the worker's uid, so a fork bomb starves the
    # snippets running beside it of processes (README, the rootless column): there it
    # runs alone, after the others; as root each snippet's uid has its own count.
    alone = {} if ROOT else {"fork-bomb": hostile.pop("fork-bomb")}
    # Filling the disk is bounded by the disk, not by a clock: on a loaded machine its
    # writes can outlast the spinners' 3 s, so it gets a timeout it never needs.
    disk = {"fill-disk": hostile.pop("fill-disk")}
    results: dict[str, ExecResult] = {}
    for group in ([(hostile, 3.0), (disk, 20.0)], [(alone, 3.0)] if alone else []):
        batches = [(batch, pool.submit(list(batch.values()), timeout_s=t)) for batch, t in group]
        for batch, submitted in batches:
            results.update(zip(batch, submitted.results(timeout_s=120), strict=True))
    assert results["redis"].stdout == "blocked\n"
    assert "'work'" in results["secrets"].stdout
    check(results)
    assert worker.process.poll() is None
    # Nothing the snippets started is left: the host is back to its own processes.
    wait_until(
        lambda: len(descendants(worker.process.pid)) <= baseline_processes,
        what="the host back to its own processes",
    )
    after = _exec_ms(pool)
    assert after <= 3 * before + 5, f"a plain snippet took {after:.1f} ms, {before:.1f} before"
