"""The reference: a fresh ``python -B -c``, as the reference sandbox runs a snippet."""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

# Started from a shell's background job or under nohup, the test runner (and so its
# children) would have SIGINT, SIGQUIT or SIGHUP ignored; an ignored signal stays ignored
# across exec. The reference starts with the defaults a fresh interpreter gets from a
# plain shell: every signal's default disposition and none blocked, then execs
# ``python -B -c`` (sys.orig_argv stays the reference's).
_START = (
    "import os, signal, sys\n"
    "for s in range(1, signal.NSIG):\n"
    "    try:\n"
    "        signal.signal(s, signal.SIG_DFL)\n"
    "    except (OSError, ValueError):\n"
    "        pass\n"
    "signal.pthread_sigmask(signal.SIG_SETMASK, [])\n"
    "os.execv(sys.executable, [sys.executable, '-B', '-c', sys.argv[1]])\n"
)


@functools.cache
def _launcher() -> list[str]:
    """What execs ``python -B -c CODE`` with default dispositions: coreutils' ``env
    --default-signal`` where it has it (one interpreter start per reference, not two),
    else _START."""
    try:
        subprocess.run(
            ["env", "--default-signal", "true"], check=True, capture_output=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return [sys.executable, "-c", _START]
    return ["env", "--default-signal", sys.executable, "-B", "-c"]


def run_reference(
    code: str, *, env: dict[str, str], cwd: Path | str, timeout_s: float = 60.0
) -> tuple[str, str, int]:
    """stdout, stderr (invalid UTF-8 replaced) and the return code of ``python -B -c``.
    The code goes on the command line as the executor sends it: UTF-8, lone surrogates
    passed through."""
    done = subprocess.run(
        [*_launcher(), code.encode("utf-8", "surrogatepass")],
        capture_output=True,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        timeout=timeout_s,
    )
    stdout, stderr = (out.decode("utf-8", "replace") for out in (done.stdout, done.stderr))
    return stdout, stderr, done.returncode
