"""Children that die with the process that started them, even when it is SIGKILLed: the
embedded Redis server and worker of ``codepool serve`` and ``codepool replay``.

Linux's parent-death signal (``prctl(PR_SET_PDEATHSIG)``) is set in the child, and
kept across ``execve``. It cannot be set from ``preexec_fn``: a command may have threads
by the time it starts a child, and a forked copy of a threaded process may deadlock in
any lock another thread held. So the child starts as a tiny interpreter (``python -I
-S``, about 10 ms) that sets the signal, checks its parent is still the one that started
it (else that parent died before the signal was armed), and execs the real command.

The signal is sent when the *thread* that forked the child ends, not the process: start
tethered children from a thread that lives as long as the process (the main thread).
Elsewhere than Linux the command runs as it is.
"""

from __future__ import annotations

import os
import signal
import sys

# argv[1]: the parent's pid; argv[2:]: the command. Exit 125 as env(1) does when it
# cannot run a command; never a code the command itself could have meant.
TETHER = (
    "import ctypes, os, sys\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    f"if libc.prctl(1, {int(signal.SIGKILL)}, 0, 0, 0) != 0:\n"
    "    sys.exit('codepool: prctl(PR_SET_PDEATHSIG) failed: ' + os.strerror(ctypes.get_errno()))\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    os._exit(125)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)


def die_with_parent(argv: list[str]) -> list[str]:
    """``argv`` as a command that is SIGKILLed when the calling thread's process (see
    the module's note on threads) dies, however it dies; unchanged off Linux."""
    if not sys.platform.startswith("linux"):
        return list(argv)
    return [sys.executable, "-I", "-S", "-c", TETHER, str(os.getpid()), *argv]
