"""A container's first process: when ``codepool`` runs as PID 1 with no init before it
(``docker run`` without ``--init``, a Kubernetes pod), every orphan in the container is
its to reap. Snippets run without a PID namespace there (container profiles refuse
them), so a process a snippet forked and left, killed when the snippet ends, becomes
PID 1's child; nothing in the worker waits for processes it did not start, and the
zombies would pile up until the container runs out of PIDs.

So PID 1 forks: the child goes on as the command, the parent stays behind as a minimal
init, as tini would: it forwards the signals an operator sends, reaps whatever
reaches it, and exits with the command's status.
"""

from __future__ import annotations

import os
import signal
from typing import NoReturn

FORWARDED = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)


def init_if_pid1() -> None:
    """Return at once in the process that goes on as the command; as PID 1, fork first
    and stay behind as its init (never returns there)."""
    if os.getpid() != 1:
        return
    command = os.fork()
    if command == 0:
        return
    _init(command)


def _init(command: int) -> NoReturn:
    def forward(signum: int, _frame: object) -> None:
        try:
            os.kill(command, signum)
        except ProcessLookupError:
            pass

    for signum in FORWARDED:
        signal.signal(signum, forward)
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:  # the command is gone and nothing else is left
            os._exit(0)
        if pid == command:
            code = os.waitstatus_to_exitcode(status)
            os._exit(code if code >= 0 else 128 - code)
