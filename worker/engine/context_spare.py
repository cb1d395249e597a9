"""A context's spare fork: the copy-on-write fork made ahead of the next fork order.

Why. Most of what ``fork()`` of a context costs is the fork itself, not Python: the
kernel copies one page-table entry per 4 KiB page of the interpreter (some 60 MiB of
numpy and sympy heap here), and then parent and child both take a copy-on-write fault
on every page they touch until the fork says hello. Measured on a 2-core host, the
clone and those first faults were some 3 ms of a 5-6 ms fork order; the Python hooks,
the work dir copy and the reseed together well under 1 ms. A lone snippet never pays
that on its critical path, because the supervisor keeps children forked ahead (warm
children). A spare does the same for a context: once a fork order is answered (and
no other order waits already), the interpreter forks one more copy of itself that
waits; the next fork order hands that copy its channel and files instead of forking.
Its own fork runs while the new forks set up, so on a busy host it takes some of their
CPU; waiting for a quiet moment first measured no better and lost tight fork loops.

Why it is the same copy. An interpreter between orders is single-threaded and blocked
reading its control socket: it runs no code, so its memory at the next order is what
it was when the spare was made. A call runs code, so it ends the spare first; so does
an interpreter with any thread besides its own (a thread the user started may change
state between orders), which never gets a spare. What the spare does not take early:
its work dir is copied from the parent's when it is handed over, and it reseeds
``random``/numpy then, so no two forks share a random stream.

Cost. One process per context that was forked and has not run a call since, sharing
all but a few hundred KiB with its parent; it counts against the family's process
limit (the supervisor leaves room for it) and goes with its parent (its link closes).
A context that is forked once and then only called pays one fork that is not used. A
fork order that follows a call on the parent finds no spare and pays the fork in full
(ops/bench/contexts.py measures both).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from collections.abc import Callable

from codepool.worker.engine import linux

CLONE_PARENT = 0x00008000
HAND_OVER = b"A"  # parent -> spare: become a fork; 3 fds (control, stdout, stderr)


class Spare:
    """The spare of one interpreter; ``make`` in the parent, ``take`` at a fork order,
    ``drop`` before anything that changes the parent's state (a call)."""

    def __init__(self) -> None:
        self.pid = 0
        self._link: socket.socket | None = None

    def make(self, become: Callable[[list[int]], None], *, prepare: Callable[[], None]) -> None:
        """Fork the spare. It runs ``prepare()`` (its reseed: it is a process of its
        own from here, so its random streams are its own), waits for a hand-over, then
        becomes the fork with ``become(fds)`` and returns from here as that fork; given
        nothing, it exits.
        Like a fork made on demand, it holds its parent's stdio and control socket
        until ``become`` puts its own in their places."""
        self.drop()
        if _threads() > 1:
            return
        try:
            link, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        except OSError:
            return
        try:
            pid = linux.fork_with_flags(CLONE_PARENT, hooks=True)
        except OSError:  # the process limit: no spare, forks are made on demand
            link.close()
            theirs.close()
            return
        if pid == 0:
            link.close()
            try:
                prepare()
            except BaseException:
                os._exit(1)  # no fork of it then: the order forks on demand
            _wait_for_order(theirs, become)
            return
        theirs.close()
        self.pid, self._link = pid, link

    def take(self, fds: list[int]) -> bool:
        """Hand one fork's 3 fds to the spare; False when there is none (or it died),
        the caller then forks."""
        link, self._link, self.pid = self._link, None, 0
        if link is None:
            return False
        try:
            socket.send_fds(link, [HAND_OVER], fds)
        except OSError:
            return False
        finally:
            link.close()
        return True

    def drop(self) -> None:
        """End the spare (its parent's state is about to change). Its parent's reaper
        reaps it; the supervisor does not know its pid and ignores that record."""
        if self._link is None:
            return
        with contextlib.suppress(OSError):
            os.kill(self.pid, signal.SIGKILL)
        self._link.close()
        self._link, self.pid = None, 0


def _wait_for_order(link: socket.socket, become: Callable[[list[int]], None]) -> None:
    try:
        kind, fds, _, _ = socket.recv_fds(link, 1, 3)
    except OSError:
        kind, fds = b"", []
    link.close()
    if kind != HAND_OVER or len(fds) != 3:
        os._exit(0)  # its parent ended it, or went
    become(fds)


def _threads() -> int:
    """This process's threads as the kernel counts them (native ones included)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 2  # unknown: treated as threaded, so no spare
