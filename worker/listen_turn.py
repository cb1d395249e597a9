"""One dispatcher per host waits on the RQ queue at a time.

A batch is announced once per live host (common/queueing.py), and Redis hands each
announcement to the dispatcher that has waited longest. With every idle dispatcher
waiting, two announcements of one batch could go to two dispatchers of the same host,
and another host would get none; with one waiting per host, each host gets one. The
turn is an ``flock`` on a file in the host's private dir: whoever holds it waits on the
queue, and passes it on as soon as it has a job. The kernel releases it when its
holder dies, so a killed dispatcher never keeps its host off the queue.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Callable


class ListenTurn:
    """The host's turn to wait on the queue, for one dispatcher process."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self._lock = threading.Lock()
        self._held = False
        self._abandoned = False

    def take(self, *, keepalive: Callable[[], None], every_s: float) -> None:
        """Block until this dispatcher has the turn, calling ``keepalive`` every
        ``every_s`` meanwhile (RQ's worker heartbeat). A signal handler that raises
        (RQ's StopRequested) interrupts the wait; the turn is then given back if the
        waiting thread gets it later."""
        got = threading.Event()
        with self._lock:
            self._abandoned = False

        def wait_for_turn() -> None:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX)
            except OSError:  # closed meanwhile: the dispatcher is exiting
                return
            with self._lock:
                if self._abandoned:
                    fcntl.flock(self._fd, fcntl.LOCK_UN)
                    return
                self._held = True
            got.set()

        # flock has no timeout: a thread blocks in it, this one keeps RQ's heartbeat.
        threading.Thread(target=wait_for_turn, name="codepool-turn", daemon=True).start()
        try:
            while not got.wait(every_s):
                keepalive()
        except BaseException:
            self.give_back(abandon=True)
            raise

    def give_back(self, *, abandon: bool = False) -> None:
        """Pass the turn on (and, with ``abandon``, refuse it if it comes later)."""
        with self._lock:
            self._abandoned = abandon
            if self._held:
                self._held = False
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        self.give_back(abandon=True)
        os.close(self._fd)
