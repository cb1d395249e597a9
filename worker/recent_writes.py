"""The results a dispatcher wrote lately, kept to be written again after a failover.

Replication is asynchronous: a result written and acked on the old primary may be
missing on the new one, and nobody would run it again (its claim, replicated earlier,
still names a live dispatcher that believes it done), so its producer would wait for
ever. With a Sentinel-managed primary the result writer therefore keeps what it wrote
during the last ``hold_s`` seconds of contact with the primary (the clock stops while
no write gets through: a primary killed mid-run leaves its last seconds kept however
long the election takes), and when the primary moves (common/failover.py) it writes
them all again, in its next write. First write wins, and only a first write is pushed
and counted (ledger.WRITE): what the new primary has is left as it is, what it lacks
is written, pushed to the done list and counted there, once.

``hold_s`` must cover the replication lag plus the time from the promotion to this
process noticing it (the sentinels' own notice, about a second, plus one poll,
``failover.POLL_S``); the default, 10 s, leaves room for a loaded host. Nothing is kept
on a Redis without Sentinel.
"""

from __future__ import annotations

import threading
import time
from collections import deque

import redis

from codepool.common import failover
from codepool.common.result import ExecResult

# At most this many results are kept (the oldest go first): a bound on memory for a
# dispatcher writing thousands a second.
MAX_KEPT = 65536

Rewrites = dict[tuple[str, str], list[tuple[int, ExecResult]]]


class RecentWrites:
    """What was written during the last ``hold_s`` s of contact, by (batch id, run)."""

    def __init__(self, conn: redis.Redis, hold_s: float) -> None:
        self.conn = conn
        self.hold_s = hold_s
        self._lock = threading.Lock()
        self._generation = failover.generation(conn)
        self._kept: deque[tuple[float, str, str, int, ExecResult]] = deque(maxlen=MAX_KEPT)

    def moved(self) -> bool:
        """The primary moved since the last write that got through."""
        return failover.generation(self.conn) != self._generation

    def pending(self) -> tuple[int, Rewrites]:
        """The generation now, and what to write again with the next write (nothing
        unless the primary moved since the last write that got through)."""
        now = failover.generation(self.conn)
        rewrites: Rewrites = {}
        with self._lock:
            if now != self._generation:
                for _, batch_id, run, index, result in self._kept:
                    rewrites.setdefault((batch_id, run), []).append((index, result))
        return now, rewrites

    def written(self, generation: int, results: list[tuple[str, str, int, ExecResult]]) -> None:
        """A write that started in ``generation`` went through with ``results``
        (batch id, run, index, result); what is older than ``hold_s`` goes."""
        now = time.monotonic()
        with self._lock:
            self._generation = generation
            while self._kept and self._kept[0][0] < now - self.hold_s:
                self._kept.popleft()
            self._kept.extend((now, *entry) for entry in results)
