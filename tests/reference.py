"""The reference: a fresh ``python -B -c``, as the reference sandbox runs a snippet."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# Started from a shell's background job, the test runner (and so its children) would
# have SIGINT and SIGQUIT ignored; the reference starts with the defaults any fresh
# interpreter gets, then execs ``python -B -c`` (sys.orig_argv stays the reference's).
_START = (
    "import os, signal, sys\n"
    "for s in (signal.SIGINT, signal.SIGQUIT):\n"
    "    signal.signal(s, signal.SIG_DFL)\n"
    "os.execv(sys.executable, [sys.executable, '-B', '-c', sys.argv[1]])\n"
)


def run_reference(code: str, *, env: dict[str, str], cwd: Path | str) -> tuple[str, str, int]:
    """stdout, stderr (invalid UTF-8 replaced) and the return code of ``python -B -c``."""
    done = subprocess.run(
        [sys.executable, "-c", _START, code],
        capture_output=True,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        timeout=60,
    )
    stdout, stderr = (out.decode("utf-8", "replace") for out in (done.stdout, done.stderr))
    return stdout, stderr, done.returncode
