"""The worker started as a container runtime starts it: under a seccomp profile that
refuses namespaces and mounts (as Docker's and Kubernetes' defaults do), with the
executor's defaults. It finds no namespaces, says so, and the second layer holds."""

from __future__ import annotations

import json
import os
import subprocess
import sys

DRIVER = r"""
import contextlib, json
from codepool.ops.doctor import host_listeners
from codepool.worker.engine import linux, seccomp
from codepool.worker import LocalExecutor

stack = contextlib.ExitStack()  # held: the listeners live as long as the driver
host = stack.enter_context(host_listeners())
linux.prctl(linux.PR_SET_NO_NEW_PRIVS, 1)
seccomp.build(group_calls=False, sockets=False).install()  # the container's profile
cases = {
    "udp": "import socket\nsocket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', "
    "('127.0.0.1', %d))" % host.udp_port,
    "tcp": "import socket\nsocket.create_connection(('127.0.0.1', %d), 1)" % host.tcp_port,
    "host-file": "open('/etc/hostname').read()",
    "tmp-write": "open('/tmp/codepool-container-mark', 'w').write('x')",
    "uid": "import os\nassert os.getuid() != 0",
}
out = {}
with LocalExecutor(concurrency=1, preload=()) as ex:  # the defaults, namespaces included
    out["report"] = {l["name"]: [l["active"], l["detail"]] for l in ex.report}
    for name, code in cases.items():
        out[name] = ex.run(code, timeout_s=5.0).status
    out["plain"] = ex.run("print(2 + 3)").stdout
out["datagram"] = host.datagram_arrived()
print(json.dumps(out))
"""


def test_a_container_profile_without_namespaces_still_isolates() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    report = out["report"]
    # It found no namespaces and said why, rather than failing.
    assert not report["network"][0] and "cannot unshare" in report["network"][1]
    assert not report["processes"][0]
    assert report["landlock"][0] and report["seccomp"][0]
    # A uid of its own per snippet only where the worker is root.
    assert report["uid"][0] is (os.geteuid() == 0)
    assert out["plain"] == "5\n"
    for name in ("udp", "tcp", "host-file", "tmp-write"):
        assert out[name] == "error", (name, out[name])
    assert out["uid"] == "ok"
    assert out["datagram"] is False, "a datagram reached the host"
