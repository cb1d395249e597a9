"""Admission at ``codepool serve``'s edge: a request that cannot start within its own
budget is answered at once (504 and ``Retry-After``, which SandboxFusion's clients
retry), not queued to time out at its client while its work runs anyway.

serve knows the work ahead of a request (its requests admitted and not yet answered),
the pool's slots (those of the live worker hosts), and how fast the pool drains that
work: answers per second since the pool was last saturated (more requests in flight
than slots), counting one answer more than seen so the first instants of a burst are
let in and a pool that answers nothing for a while is found out within about a second.
The estimated wait of a new request is the requests that must start before it, less the
free slots, over that rate. Its budget is what it may spend waiting for a slot: the
client's ``X-Request-Timeout`` less the request's run time when the client sends one,
else its ``compile_timeout`` (SandboxFusion's compile budget: nothing compiles here,
and verl's client waits ``compile_timeout + run_timeout + 10`` s in all).
"""

from __future__ import annotations

import collections
import time
from typing import cast

import redis

from codepool.common.settings import Settings

# Answers older than this do not tell the drain rate.
WINDOW_S = 10.0
# A saturated spell younger than this is judged as if it were this old.
MIN_ELAPSED_S = 0.05
# A worker host whose heartbeat is older than this has no slots (ops/stats_view.ALIVE_S).
ALIVE_S = 30.0
# What a new request's Retry-After says at least (seconds).
MIN_RETRY_AFTER_S = 1


class Admission:
    """The requests in flight at one serve, and the estimate of a new one's wait. Not
    thread-safe: serve's event loop is its one user."""

    def __init__(self, *, slots: int = 1) -> None:
        self.slots = max(1, slots)
        self.in_flight = 0
        self._saturated_since: float | None = None
        self._answers: collections.deque[float] = collections.deque()

    def set_slots(self, slots: int, now: float | None = None) -> None:
        """The pool's slots now (at least one is assumed)."""
        now = time.monotonic() if now is None else now
        self.slots = max(1, slots)
        if self.in_flight < self.slots:
            self._saturated_since = None
            self._answers.clear()
        elif self._saturated_since is None:
            self._saturated_since = now

    def wait_s(self, now: float | None = None) -> float:
        """Seconds a request arriving now is estimated to wait for a slot."""
        now = time.monotonic() if now is None else now
        ahead = self.in_flight - self.slots + 1
        if ahead <= 0 or self._saturated_since is None:
            return 0.0
        start = max(self._saturated_since, now - WINDOW_S)
        while self._answers and self._answers[0] < start:
            self._answers.popleft()
        rate = (len(self._answers) + 1) / max(now - start, MIN_ELAPSED_S)
        return ahead / rate

    def admit(self, budget_s: float, now: float | None = None) -> float | None:
        """Take a request whose budget for waiting is ``budget_s``: None if it is in
        flight now (``answered`` must follow), else the estimated wait that refused it."""
        now = time.monotonic() if now is None else now
        wait = self.wait_s(now)
        if wait > budget_s:
            return wait
        self.in_flight += 1
        if self.in_flight >= self.slots and self._saturated_since is None:
            self._saturated_since = now
        return None

    def answered(self, *, ran: bool, now: float | None = None) -> None:
        """A request admitted is out of flight: answered from the pool (``ran``), or
        given up on (its client left, its work cancelled: it tells nothing of the rate)."""
        now = time.monotonic() if now is None else now
        self.in_flight -= 1
        if ran and self._saturated_since is not None:
            self._answers.append(now)
        if self.in_flight < self.slots:
            self._saturated_since = None
            self._answers.clear()


def retry_after_s(wait_s: float) -> int:
    """The ``Retry-After`` for a request refused with an estimated wait of ``wait_s``."""
    return max(MIN_RETRY_AFTER_S, min(3600, int(wait_s + 0.999)))


def start_budget_s(*, header: str | None, timeout_s: float, compile_s: float) -> float:
    """What a request may spend waiting for a slot (see the module's docstring);
    ``header`` is the client's ``X-Request-Timeout`` (seconds), if sent and a number."""
    if header is not None:
        try:
            total = float(header)
        except ValueError:
            total = float("nan")
        if total == total and total > 0:  # not NaN
            return max(0.0, total - timeout_s)
    return compile_s


def pool_slots(conn: redis.Redis, settings: Settings, now_s: float | None = None) -> int:
    """The slots of the worker hosts with a heartbeat in the last ``ALIVE_S`` (0: none)."""
    now = time.time() if now_s is None else now_s
    keys = settings.keys
    names = cast(list[bytes], conn.zrangebyscore(keys.workers(), now - ALIVE_S, "+inf"))
    if not names:
        return 0
    with conn.pipeline(transaction=False) as pipe:
        for name in names:
            pipe.hget(keys.worker_stats(name.decode()), "slots")
        slots = pipe.execute()
    return sum(int(value) for value in slots if value is not None)
