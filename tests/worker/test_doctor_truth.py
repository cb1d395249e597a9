"""What `codepool doctor` says a snippet gets, checked against what a snippet meets:
the capability sets and the file descriptors of a real child."""

from __future__ import annotations

import json

from codepool.worker.engine.executor import LocalExecutor

PROBE = r"""
import json, os
status = {}
for line in open('/proc/self/status'):
    key, _, value = line.partition(':')
    status[key] = value.strip()
fds = []
for fd in range(64):
    try:
        os.fstat(fd)
    except OSError:
        continue
    fds.append(fd)
print(json.dumps({'status': status, 'fds': fds}))
"""


def test_doctors_capability_and_descriptor_lines_hold_in_a_child() -> None:
    with LocalExecutor(concurrency=1, preload=()) as executor:
        said = {line["name"]: line["detail"] for line in executor.report}
        result = executor.run(PROBE)
    assert result.ok, result
    seen = json.loads(result.stdout)
    status = seen["status"]
    assert "effective, permitted, inheritable or ambient" in said["capabilities"]
    for field in ("CapEff", "CapPrm", "CapInh", "CapAmb"):
        assert int(status[field], 16) == 0, (field, status[field])
    assert "no_new_privs" in said["capabilities"] and status["NoNewPrivs"] == "1"
    assert "stdio and the pipe its end is told on (fd 4" in said["file descriptors"]
    assert seen["fds"] == [0, 1, 2, 4], seen["fds"]
