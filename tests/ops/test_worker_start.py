"""A worker whose Redis cannot be reached at start says so in one line and exits
non-zero (before, its dispatchers crashed and restarted in a loop, forever, logging
tracebacks); a Redis lost later is ridden out (tests/reliability/test_redis_restart.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from codepool.worker.host import START_WAIT_S

# The start check's own window, and the interpreter's start on a loaded machine.
EXITS_WITHIN_S = START_WAIT_S + 60.0


@pytest.mark.parametrize(
    "url",
    ["redis://127.0.0.1:1/0", "redis+sentinel://127.0.0.1:1/nosuch"],
    ids=["plain", "sentinel"],
)
def test_an_unreachable_redis_at_start_is_said_once_and_the_worker_exits(url: str) -> None:
    command = [sys.executable, "-m", "codepool.ops.cli", "worker", "-c", "1", "--preload", ""]
    done = subprocess.run(
        [*command, "--url", url], capture_output=True, text=True, timeout=EXITS_WITHIN_S
    )
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert done.returncode != 0
    assert len(lines) == 1, lines
    assert "cannot reach Redis" in lines[0] and "127.0.0.1:1" in lines[0], lines
    assert "Traceback" not in done.stderr
