"""Waiting for a child process to end, with a bound: the one way codepool stops children."""

from __future__ import annotations

import subprocess


def wait_or_kill(process: subprocess.Popen[bytes], timeout_s: float = 10.0) -> int:
    """Wait up to ``timeout_s`` for ``process`` to exit, then SIGKILL it; its exit code."""
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()
