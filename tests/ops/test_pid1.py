"""``codepool`` as a container's first process (PID 1, no ``--init``), under a container
runtime's seccomp profile: snippets run without a PID namespace, so what they fork and
leave becomes PID 1's to reap (ops/pid1.py)."""

from __future__ import annotations

import os
import shutil
import signal
import sys

import pytest

from codepool.ops.bench.process_tree import children, descendants, process_state
from codepool.producer import CodePool
from tests.conftest import ROOT, StartWorker, wait_until
from tests.hostile import HOSTILE

# Installs the profile Docker's and Kubernetes' defaults resemble (no namespaces, no
# mounts), then execs its arguments: the command starts as the runtime would start it.
AS_A_CONTAINER = (
    "import os, sys\n"
    "from codepool.worker.engine import linux, seccomp\n"
    "linux.prctl(linux.PR_SET_NO_NEW_PRIVS, 1)\n"
    "seccomp.build(group_calls=False, sockets=False).install()\n"
    "os.execv(sys.argv[1], sys.argv[1:])\n"
)

pytestmark = pytest.mark.skipif(
    not ROOT or shutil.which("unshare") is None, reason="needs root and unshare(1)"
)


def zombies_below(pid: int) -> list[int]:
    """Zombies among the processes below ``pid``."""
    return [member for member in descendants(pid) if process_state(member) == "Z"]


def test_a_pid1_worker_reaps_what_snippets_leave(redis_url: str, start_worker: StartWorker) -> None:
    namespace = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]
    worker = start_worker(wrap=[*namespace, sys.executable, "-c", AS_A_CONTAINER])
    (first,) = children(worker.process.pid)  # PID 1 in the namespace; unshare waits on it
    pool = CodePool(redis_url)
    try:
        # A daemon's intermediate parent exits at once and its sleeper is killed with the
        # snippet: both end up the children of whoever is PID 1.
        codes = [HOSTILE["daemon"]] * 4 + ["import os\nprint(os.getpid() == 1)"]
        results = pool.submit(codes, timeout_s=10.0).results(timeout_s=60)
        # The last is not its namespace's init: snippets run without a PID namespace.
        expected = [("ok", "parent done\n")] * 4 + [("ok", "False\n")]
        assert [(r.status, r.stdout) for r in results] == expected, results
        wait_until(
            lambda: zombies_below(worker.process.pid) == [],
            what=lambda: f"zombies left: {zombies_below(worker.process.pid)}",
        )
    finally:
        pool.close()
        os.kill(first, signal.SIGTERM)  # unshare(1) does not pass a SIGTERM on
        worker.process.wait(timeout=30)
