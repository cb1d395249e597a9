"""Taking snippets back from the executor (what a stopping dispatcher does): one that
waits for a slot is dropped and never starts, one that runs goes on unless asked for
too, then it is killed; nothing of either is left, and the executor serves on."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator

import pytest

from codepool.worker import LocalExecutor
from tests.conftest import assert_nothing_left, sleeping_below, wait_until


@pytest.fixture(scope="module")
def one_slot() -> Iterator[LocalExecutor]:
    with LocalExecutor(concurrency=1, preload=()) as executor:
        yield executor


def test_what_waits_is_dropped_and_what_runs_goes_on(one_slot: LocalExecutor) -> None:
    running = one_slot.submit("import time\ntime.sleep(2)\nprint('ran')", timeout_s=30)
    wait_until(lambda: sleeping_below(one_slot.supervisor_pid) == 1, what="the first running")
    waiting = one_slot.submit("print('must not run')", timeout_s=30)
    one_slot.withdraw([running, waiting])
    with pytest.raises(concurrent.futures.CancelledError):
        waiting.result(timeout=30)
    assert running.result(timeout=30).stdout == "ran\n"
    assert one_slot.run("print(1)").stdout == "1\n"
    assert_nothing_left(one_slot)


def test_with_running_what_runs_is_killed_too(one_slot: LocalExecutor) -> None:
    running = one_slot.submit("import time\ntime.sleep(600)", timeout_s=900)
    wait_until(lambda: sleeping_below(one_slot.supervisor_pid) == 1, what="it runs")
    done = one_slot.submit("print('done')")  # waits for the slot
    one_slot.withdraw([running], running=True)
    with pytest.raises(concurrent.futures.CancelledError):
        running.result(timeout=30)
    assert done.result(timeout=30).stdout == "done\n"  # not asked for: it runs next
    one_slot.withdraw([done], running=True)  # already done: nothing changes
    assert done.result().stdout == "done\n"
    assert_nothing_left(one_slot)
