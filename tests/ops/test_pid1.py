"""``codepool`` as a container's first process (PID 1, no ``--init``), under a container
runtime's seccomp profile: snippets run without a PID namespace, so what they fork and
leave becomes PID 1's to reap (ops/pid1.py)."""

from __future__ import annotations

import os
import shutil
import signal
import sys

import pytest

from codepool.ops.bench.process_tree import descendants
from codepool.producer import CodePool
from tests.conftest import ROOT, StartWorker, wait_until

# Installs the profile Docker's and Kubernetes' defaults resemble (no namespaces, no
# mounts), then execs its arguments: the command starts as the runtime would start it.
AS_A_CONTAINER = (
    "import os, sys\n"
    "from codepool.worker.engine import linux, seccomp\n"
    "linux.prctl(linux.PR_SET_NO_NEW_PRIVS, 1)\n"
    "seccomp.build(group_calls=False, sockets=False).install()\n"
    "os.execv(sys.argv[1], sys.argv[1:])\n"
)
# A daemon: its intermediate parent exits at once and the sleeper is killed with the
# snippet; both end up the children of whoever is PID 1.
ORPHANS = (
    "import os, time\n"
    "if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    if os.fork() == 0:\n"
    "        time.sleep(1000)\n"
    "    os._exit(0)\n"
    "print('parent done', os.getpid() == 1)"
)

pytestmark = pytest.mark.skipif(
    not ROOT or shutil.which("unshare") is None, reason="needs root and unshare(1)"
)


def children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(child) for child in f.read().split()]


def zombies_below(pid: int) -> list[int]:
    """Zombies among the processes below ``pid``."""
    return [member for member in descendants(pid) if _state(member) == "Z"]


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def test_a_pid1_worker_reaps_what_snippets_leave(redis_url: str, start_worker: StartWorker) -> None:
    namespace = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]
    worker = start_worker(wrap=[*namespace, sys.executable, "-c", AS_A_CONTAINER])
    (first,) = children(worker.process.pid)  # PID 1 in the namespace; unshare waits on it
    pool = CodePool(redis_url)
    try:
        results = pool.submit([ORPHANS] * 4, timeout_s=10.0).results(timeout_s=60)
        # Not its namespace's init: the snippets ran without a PID namespace.
        expected = [("ok", "parent done False\n")] * 4
        assert [(r.status, r.stdout) for r in results] == expected, results
        # Each snippet left two orphans (its daemon's parent, then the killed sleeper).
        wait_until(
            lambda: zombies_below(worker.process.pid) == [],
            what=lambda: f"zombies left: {zombies_below(worker.process.pid)}",
        )
    finally:
        pool.close()
        os.kill(first, signal.SIGTERM)  # unshare(1) does not pass a SIGTERM on
        worker.process.wait(timeout=30)
