"""The suite's own hygiene: a pool a test leaves open is closed when the test ends
(tests/conftest.py's close_leftover_pools), so its lease thread does not live on in the
test process. The two tests run in order, in one process (the file is one unit)."""

from __future__ import annotations

import threading

from codepool.producer import CodePool

LEFT_OPEN: list[CodePool] = []


def lease_threads() -> int:
    return sum(t.name == "codepool-producer-lease" and t.is_alive() for t in threading.enumerate())


def test_a_test_that_leaves_its_pool_open(redis_url: str) -> None:
    pool = CodePool(redis_url)
    pool.submit(["print(1)"], timeout_s=5)  # in flight: the lease's thread runs
    assert lease_threads() >= 1
    LEFT_OPEN.append(pool)


def test_finds_it_closed_by_the_next() -> None:
    assert [pool.closed for pool in LEFT_OPEN] == [True]
    for _ in range(100):
        if lease_threads() == 0:
            break
        threading.Event().wait(0.05)
    assert lease_threads() == 0
