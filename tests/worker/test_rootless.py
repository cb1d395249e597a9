"""The executor run by a non-root user, as a researcher's host would: with user
namespaces, and with ``namespaces=False``. The user, its home and the copy of codepool it
runs are made here and removed afterwards; it runs Debian's own python3, since the
suite's interpreter lives under /root (mode 700)."""

from __future__ import annotations

import json
import os
import pwd
import subprocess

import pytest

from tests.conftest import ReadableCopy, needs_a_system_python, processes_of, wait_until

pytestmark = needs_a_system_python

# Run by the user: start an executor, try each hostile case, print what happened.
DRIVER = r"""
import contextlib, json, os, sys
from codepool.ops.doctor import host_listeners
from codepool.worker import LocalExecutor

namespaces, secret_path = sys.argv[1] in ("ns", "ns-no-landlock"), sys.argv[2]
landlock = sys.argv[1] != "ns-no-landlock"
os.environ["CODEPOOL_TEST_SECRET"] = "hunter2"
stack = contextlib.ExitStack()  # held: the listeners live as long as the driver
host = stack.enter_context(host_listeners())
cases = {
    "identity": "import os\nstatus = open('/proc/self/status').read().splitlines()\n"
    "caps = {l.split(':')[0]: int(l.split()[1], 16) for l in status if l.startswith('Cap')}\n"
    "print(os.getuid(), os.geteuid(), caps['CapEff'], caps['CapPrm'], caps['CapAmb'])",
    "home": "print(open(%r).read())" % secret_path,
    "tcp": "import socket\nsocket.create_connection(('127.0.0.1', %d), 1)\nprint('x')"
    % host.tcp_port,
    "udp": "import socket\nsocket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', "
    "('127.0.0.1', %d))\nprint('x')" % host.udp_port,
    "abstract": "import socket\nsocket.socket(socket.AF_UNIX).connect(%r)\nprint('x')"
    % host.abstract,
    "environ": "import os\nseen = []\nfor p in os.listdir('/proc'):\n    try:\n"
    "        seen.append(open('/proc/%s/environ' % p, 'rb').read())\n    except OSError:\n"
    "        pass\nprint(any(b'hunter2' in s for s in seen))",
    "kill-parent": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint('x')",
    "kill-all": "import os, signal\nos.kill(-1, signal.SIGKILL)\nprint('x')",
    "tmp-write": "open('/tmp/codepool-rootless-mark', 'w').write('x')\nprint('x')",
    "tmp-read": "import os\nprint(os.path.exists('/tmp/codepool-rootless-mark'))",
}
cases["fork-bomb"] = (
    "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
)
cases["fork-cap"] = (  # children that wait, counted until fork() is refused
    "import os, time\nn = 0\nwhile n < 1000:\n    try:\n        pid = os.fork()\n"
    "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(60)\n"
    "        os._exit(0)\n    n += 1\nprint(n)"
)
cases["after-bomb"] = (
    "import os, threading\npid = os.fork()\nif pid == 0:\n    os._exit(0)\n"
    "os.waitpid(pid, 0)\nt = threading.Thread(target=print, args=('thread',))\n"
    "t.start()\nt.join()"
)
out = {}
with LocalExecutor(concurrency=1, preload=(), namespaces=namespaces, landlock=landlock) as ex:
    out["report"] = {l["name"]: l["active"] for l in ex.report}
    zygotes = set()
    for name, code in cases.items():
        r = ex.run(code, timeout_s=5.0)
        out[name] = [r.status, r.stdout.strip(), r.stderr.strip()[-300:]]
        zygotes.add(r.zygote)
    out["zygotes"] = sorted(zygotes)
    out["after"] = ex.run("print('still serving')").stdout.strip()
    out["worker-forks"] = os.waitpid(os.spawnv(os.P_NOWAIT, "/bin/true", ["true"]), 0)[1]
    out["report-detail"] = {l["name"]: l["detail"] for l in ex.report}
out["datagram"] = host.datagram_arrived()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def user(
    throwaway_user: pwd.struct_passwd, readable_codepool: ReadableCopy
) -> tuple[pwd.struct_passwd, ReadableCopy]:
    """The throwaway user, and the copy of codepool it runs with this module's driver."""
    readable_codepool.script("driver.py", DRIVER)
    return throwaway_user, readable_codepool


def _as_user(
    user: tuple[pwd.struct_passwd, ReadableCopy], *argv: str
) -> subprocess.CompletedProcess[str]:
    entry, copy = user
    return copy.run(*argv, user=entry)


def _drive(user: tuple[pwd.struct_passwd, ReadableCopy], namespaces: bool) -> dict[str, object]:
    mode = "ns" if namespaces else "no-ns"
    proc = _as_user(user, "driver.py", mode, os.path.join(user[0].pw_dir, "secret"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The fork-cap case left children sleeping a minute: they died with their snippet.
    uid = user[0].pw_uid
    wait_until(lambda: not processes_of(range(uid, uid + 1)), what="the snippets' children gone")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def test_doctor_as_a_non_root_user_names_the_environment_and_passes(
    user: tuple[pwd.struct_passwd, ReadableCopy],
) -> None:
    proc = _as_user(user, "-c", "import sys\nfrom codepool.ops import doctor\n"
                    "sys.exit(doctor.main('fork', ()))")  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "environment: rootless host with user namespaces" in proc.stdout
    assert "[--] uid" in proc.stdout  # not to be had without root: a warning, not a failure
    assert "[!!]" not in proc.stdout


@pytest.mark.parametrize("namespaces", [True, False], ids=["user-namespaces", "no-namespaces"])
def test_a_non_root_worker_holds_against_hostile_snippets(
    user: tuple[pwd.struct_passwd, ReadableCopy], namespaces: bool
) -> None:
    out = _drive(user, namespaces)
    report = out["report"]
    assert isinstance(report, dict)
    assert report["landlock"] and report["seccomp"] and report["capabilities"], report
    uid = user[0].pw_uid
    status, identity, _ = out["identity"]  # type: ignore[misc]
    assert status == "ok" and identity == f"{uid} {uid} 0 0 0", "never uid 0, never a capability"
    # Where the C set-up runs, plain snippets ran on the bare image, which keeps the
    # namespace owner's capabilities through its exec, and the child still has none.
    set_up = out["report-detail"]["child set-up"]  # type: ignore[index]
    assert out["zygotes"] == (["bare"] if set_up.startswith("in C") else ["heavy"]), out
    # With namespaces /tmp is the snippet's own tmpfs; without, writing there is refused.
    refused = ["home", "tcp", "udp", "abstract"] + ([] if namespaces else ["tmp-write"])
    for name in refused:
        result = out[name]
        assert isinstance(result, list)
        assert result[0] != "ok" and "x" != result[1], (name, result)
    assert out["environ"] == ["ok", "False", ""], "the worker's environment leaked"
    assert out["tmp-read"][:2] == ["ok", "False"]  # type: ignore[index]
    # The parent is out of reach (its pid is 0 in a PID namespace, and Landlock scopes
    # signals without one), and so is everything else of the worker user's: the driver
    # that started the executor lived on to print this, and the executor still serves.
    assert out["after"] == "still serving", "kill(getppid()) or kill(-1) reached the worker"
    assert out["datagram"] is False, "a datagram reached the host"
    # A fork bomb is capped (in the user namespace, or on the worker user's own uid),
    # the next snippet on the slot forks and starts a thread, and the worker still forks.
    assert report["process limit"], report
    assert out["fork-bomb"][0] == "timeout"  # type: ignore[index]
    status, forks, _ = out["fork-cap"]  # type: ignore[misc]
    # max_procs is 32, plus the slack of a count shared with the executor's own tasks.
    assert status == "ok" and 20 <= int(forks) <= 40, f"{forks} forks ran"
    assert out["after-bomb"][:2] == ["ok", "thread"], out["after-bomb"]  # type: ignore[index]
    assert out["worker-forks"] == 0


def test_the_worker_users_home_is_hidden_by_the_namespace_alone(
    user: tuple[pwd.struct_passwd, ReadableCopy],
) -> None:
    """On a kernel without Landlock the mount namespace must hide the home by itself."""
    proc = _as_user(user, "driver.py", "ns-no-landlock", os.path.join(user[0].pw_dir, "secret"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not out["report"]["landlock"]
    assert out["home"][0] == "error" and "secret" not in out["home"][1], out["home"]
    assert out["identity"][1] == f"{user[0].pw_uid} {user[0].pw_uid} 0 0 0"
