"""Without namespaces (namespaces=False, as on a host that refuses them) the executor
still runs snippets, still cleans up after them as root, and says what is missing."""

from __future__ import annotations

import os
import signal
import tempfile
import time

import pytest

from codepool.common.errors import ExecutorError
from codepool.ops.doctor import host_listeners
from codepool.worker import LocalExecutor
from codepool.worker.engine.config import FALLBACK_PREFIX
from tests.conftest import needs_root, processes_of


@needs_root  # the uid sweep is the root fallback; non-root: tests/worker/test_rootless.py
def test_fallback_runs_and_cleans_up() -> None:
    # subprocess is preloaded: without a mount namespace the snippet uid cannot read the
    # interpreter's files under /root on this host, and the report says so.
    with LocalExecutor(concurrency=2, mode="fork", preload=("subprocess",), namespaces=False) as ex:
        report = {line["name"]: line for line in ex.report}
        assert not report["namespaces"]["active"]
        assert "namespaces=False" in report["namespaces"]["detail"]
        assert not report["processes"]["active"]
        assert report["uid"]["active"]
        if any(os.stat(p).st_mode & 0o001 == 0 for p in ("/root",) if os.path.exists(p)):
            assert not report["interpreter paths"]["active"]

        r = ex.run("print(2 + 3)")
        assert (r.ok, r.stdout) == (True, "5\n")
        assert ex.run("while True: pass", timeout_s=1.0).limit == "wall_time"
        # Not a PID namespace's init: the soft CPU limit's SIGXCPU ends it.
        hog = ex.run("while True: pass", cpu_s=1.0, timeout_s=20.0)
        assert (hog.status, hog.returncode, hog.limit) == ("signal", -24, "cpu_time"), hog

        marker = f"/tmp/codepool-fallback-{os.getpid()}"
        daemon = (
            "import os, subprocess, sys, time\n"
            "try:\n"
            f"    open({marker!r}, 'w').write('x')\n"
            "except PermissionError:\n"
            "    print('refused')\n"
            "open(os.path.join(os.environ['TMPDIR'], 'x'), 'w').write('x')\n"  # its work dir
            "subprocess.Popen(['sleep', '1000'])\n"
            "sys.stdout.flush()\n"
            "if os.fork() == 0:\n"
            "    try:\n"
            "        os.setsid()\n"  # refused (seccomp): it stays in the process group
            "    except PermissionError:\n"
            "        pass\n"
            "    time.sleep(1000)\n"
            "print(os.getcwd())"
        )
        r = ex.run(daemon)
        assert r.ok, r.stderr
        refused, workdir = r.stdout.split()
        # The host's /tmp is shared without a mount namespace: Landlock keeps the
        # snippet's writes inside its own work dir.
        assert refused == "refused"
        deadline = time.monotonic() + 5
        while processes_of(ex.snippet_uids, except_children_of=ex.supervisor_pid):
            assert time.monotonic() < deadline, "snippet processes outlived it"
            time.sleep(0.05)
        assert not os.path.exists(marker)
        assert not os.path.exists(workdir)


FORK_BOMB = (
    "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
)
FORK_AND_THREAD = (
    "import os, threading\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    os._exit(0)\n"
    "os.waitpid(pid, 0)\n"
    "t = threading.Thread(target=print, args=('thread',))\n"
    "t.start()\n"
    "t.join()"
)


def _work_dirs(supervisor_pid: int) -> list[str]:
    prefix = f"{FALLBACK_PREFIX}{supervisor_pid}-"
    return [e.path for e in os.scandir(tempfile.gettempdir()) if e.name.startswith(prefix)]


def test_a_fork_bomb_never_reaches_the_next_snippet() -> None:
    with LocalExecutor(concurrency=1, preload=(), namespaces=False) as ex:
        for _ in range(2):
            assert ex.run(FORK_BOMB, timeout_s=2.0).status in ("timeout", "error")
            # Every slot's uid in turn: none may still count the bomb's processes.
            for _ in range(4):
                r = ex.run(FORK_AND_THREAD)
                assert (r.status, r.stdout) == ("ok", "thread\n"), r.stderr


def test_nothing_is_left_in_tmp_after_close_or_after_a_crash() -> None:
    with LocalExecutor(concurrency=2, preload=(), namespaces=False) as ex:
        assert ex.run("print(1)").ok
        pid = ex.supervisor_pid
        assert _work_dirs(pid)  # the waiting children's dirs, so the check below can fail
    assert _work_dirs(pid) == []
    # A supervisor killed -9 leaves its waiting children's dirs; the next one sweeps them.
    crashed = LocalExecutor(concurrency=2, preload=(), namespaces=False)
    try:
        assert crashed.run("print(1)").ok
        dead = crashed.supervisor_pid
        os.kill(dead, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/{dead}") and _is_running(dead):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert _work_dirs(dead)
        with LocalExecutor(concurrency=1, preload=(), namespaces=False) as fresh:
            assert fresh.run("print(1)").ok
            assert _work_dirs(dead) == []
    finally:
        crashed.close()


def _is_running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_the_second_layer_holds_without_namespaces() -> None:
    """No network namespace, no mount namespace: Landlock and seccomp still keep the
    snippet off the host's sockets and files and inside its process group."""
    with (
        host_listeners() as host,
        LocalExecutor(concurrency=1, preload=(), namespaces=False) as ex,
    ):
        report = {line["name"]: line for line in ex.report}
        assert report["landlock"]["active"] and report["seccomp"]["active"]
        attempts = {
            "udp": "import socket\nsocket.socket(socket.AF_INET, socket.SOCK_DGRAM)"
            f".sendto(b'x', ('127.0.0.1', {host.udp_port}))",
            "tcp": f"import socket\nsocket.create_connection(('127.0.0.1', {host.tcp_port}))",
            "abstract": f"import socket\nsocket.socket(socket.AF_UNIX).connect({host.abstract!r})",
            "host file": "open('/etc/hostname').read()",
            "new session": "import os\nos.setsid() if os.fork() == 0 else os.wait()\nos.setsid()",
            "namespace": "import ctypes\nassert ctypes.CDLL(None).unshare(0x10000000) == 0",
        }
        for name, code in attempts.items():
            r = ex.run(code, timeout_s=5.0)
            assert r.status == "error", (name, r)
        assert not host.datagram_arrived(), "a datagram reached the host"


def test_without_either_layer_the_executor_refuses_unless_told() -> None:
    """No PID namespace and no Landlock (here: both turned off): nothing would keep a
    snippet from signalling the worker, so the executor refuses, naming what is missing."""
    with pytest.raises(ExecutorError, match=r"no PID namespace .* and no Landlock"):
        LocalExecutor(concurrency=1, preload=(), namespaces=False, landlock=False)
    with LocalExecutor(
        concurrency=1, preload=(), namespaces=False, landlock=False, allow_weak_isolation=True
    ) as ex:
        assert ex.run("print(1)").stdout == "1\n"


def test_fallback_inputs_and_fetch_stay_in_the_work_dir() -> None:
    # Without a mount namespace the work dir is a host directory the supervisor (root)
    # reads back from: what the snippet links there must not be followed.
    secret = tempfile.NamedTemporaryFile(prefix="codepool-secret-", delete=False)
    secret.write(b"root only")
    secret.close()
    os.chmod(secret.name, 0o600)
    try:
        with LocalExecutor(
            concurrency=1, mode="fork", preload=("subprocess",), namespaces=False
        ) as ex:
            code = (
                "import os\n"
                f"os.symlink({secret.name!r}, 'link')\n"
                f"os.symlink({os.path.dirname(secret.name)!r}, 'dir')\n"
                "open('out', 'w').write(input() + open('in').read())"
            )
            name = os.path.basename(secret.name)
            r = ex.run(
                code, stdin="a", files={"in": "b"}, fetch_files=["link", f"dir/{name}", "out"]
            )
            assert r.ok, r.stderr
            assert r.files == {"out": b"ab"}
    finally:
        os.unlink(secret.name)
