"""A fork-mode child's done notice (worker/engine/done.py): its result goes out at the
notice, before the exit's teardown; a notice the snippet forges ends it there, and one it
garbles changes nothing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from codepool.worker import LocalExecutor
from codepool.worker.engine import contract
from tests.conftest import assert_nothing_left, processes_of

FORGED = (
    "import os, struct\n"
    "print('before', flush=True)\n"
    f"os.write(4, struct.pack({contract.DONE_FORMAT!r}, 7, {contract.DONE_MAGIC}, 0, 0, 1))\n"
    "import time\n"
    "time.sleep(30)\n"
    "print('after', flush=True)\n"
)


@pytest.fixture(scope="module", params=[True, False], ids=["c-set-up", "python-set-up"])
def forking(request: pytest.FixtureRequest) -> Iterator[LocalExecutor]:
    with LocalExecutor(concurrency=2, mode="fork", native_child=request.param) as executor:
        yield executor


def test_a_forged_notice_ends_the_snippet_there(forking: LocalExecutor) -> None:
    r = forking.run(FORGED, timeout_s=20.0)
    assert (r.stdout, r.returncode, r.status, r.timed_out) == ("before\n", 7, "error", False)
    assert r.exec_s < 15, "the result waited for the snippet's sleep"
    assert_nothing_left(forking)


def test_a_garbled_notice_changes_nothing(forking: LocalExecutor) -> None:
    r = forking.run("import os\nos.write(4, b'not a notice')\nprint('went on')")
    assert (r.ok, r.stdout, r.returncode) == (True, "went on\n", 0)
    assert_nothing_left(forking)


def test_a_snippet_whose_processes_outlive_its_notice_ends_at_its_exit(
    forking: LocalExecutor,
) -> None:
    r = forking.run("import subprocess\nsubprocess.Popen(['sleep', '1000'])\nprint('bg')")
    # Killed at its notice, it keeps the notice's exit code, not SIGKILL's; its result
    # waits for the exit, which takes the background process with it.
    assert (r.ok, r.returncode, r.signal, r.stdout) == (True, 0, None, "bg\n")
    assert not any("sleep 1000" in cmd for cmd in processes_of(range(0, 2**32)))
    assert_nothing_left(forking)


def test_the_notice_reports_the_childs_cpu_and_memory(forking: LocalExecutor) -> None:
    r = forking.run("x = bytearray(64 << 20)\nfor i in range(2 * 10**6):\n    pass")
    assert r.ok and r.cpu_s > 0.02 and r.max_rss_kb > 64 << 10
    assert_nothing_left(forking)
