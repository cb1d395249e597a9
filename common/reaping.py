"""Waiting for a child process to end, with a bound: the one way codepool stops children."""

from __future__ import annotations

import os
import signal
import subprocess


def wait_or_kill(
    process: subprocess.Popen[bytes], timeout_s: float = 10.0, *, group: bool = False
) -> int:
    """Wait up to ``timeout_s`` for ``process`` to exit, then SIGKILL it (``group``: its
    whole process group, for one started in a session of its own); its exit code."""
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        if group:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        else:
            process.kill()
        return process.wait()
