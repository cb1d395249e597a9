"""A dispatcher's lease: a heartbeat every ``heartbeat_s`` that keeps its claims its own,
and the janitor's round that recovers dispatchers whose lease lapsed (and cancels the
batches of producers whose lease lapsed).

The lease lives in Redis (``ledger.HEARTBEAT``, server time). This side keeps the time of
the last heartbeat Redis answered, so the result writer can tell, without asking Redis,
whether the lease may have lapsed meanwhile (the process was frozen, or cut off): then
it waits for the next heartbeat's verdict, and a fenced dispatcher writes nothing more.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import redis

from codepool.common.janitor import Janitor
from codepool.common.ledger import heartbeat_script
from codepool.common.settings import Settings

log = logging.getLogger(__name__)

# The writer trusts the lease for this much less than its length (clock rates, latency).
TRUST_MARGIN_S = 1.5


class LeaseKeeper:
    """Heartbeats for ``owner`` (a dispatcher of worker host ``host``, whose score in
    the live hosts each beat renews too); ``on_lost`` runs once if the lease was taken
    away."""

    def __init__(
        self,
        conn: redis.Redis,
        settings: Settings,
        *,
        owner: str,
        host: str,
        on_lost: Callable[[], None],
    ) -> None:
        self.conn = conn
        self.settings = settings
        self.owner = owner
        self.host = host
        self.on_lost = on_lost
        self.janitor = Janitor(conn, settings, name=owner)
        self.live = 1  # live hosts in the fleet, from the last heartbeat
        self.lost = threading.Event()
        self._renewed = threading.Condition()
        self._last_ok = 0.0  # monotonic time of the last answered heartbeat
        self._producers_lapsed: list[str] = []  # from the last heartbeat: to abandon
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="codepool-lease", daemon=True)

    def start(self) -> None:
        """Take the lease (raises RedisError if Redis cannot be reached) and keep it."""
        self._beat(first=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop heartbeating and give the lease up (a clean exit, nothing to recover)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        if self.lost.is_set():
            return  # a janitor owns what is left of it
        keys = self.settings.keys
        try:
            with self.conn.pipeline(transaction=False) as pipe:
                pipe.zrem(keys.leases(), self.owner)
                pipe.delete(keys.owner_batches(self.owner))
                pipe.execute()
        except redis.RedisError as exc:
            log.warning("dispatcher %s: could not give up its lease: %s", self.owner, exc)

    def trusted(self) -> bool:
        """True while the lease certainly holds (no Redis round trip)."""
        age = time.monotonic() - self._last_ok
        return not self.lost.is_set() and age < self.settings.lease_s - TRUST_MARGIN_S

    def confirm(self, timeout_s: float) -> bool:
        """True if the lease holds: at once when trusted, else after the next heartbeat
        Redis answers. False if it was lost, or no verdict came within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._renewed:
            while not self.trusted():
                remaining = deadline - time.monotonic()
                if self.lost.is_set() or remaining <= 0:
                    return False
                self._renewed.wait(min(remaining, self.settings.heartbeat_s))
        return True

    def _loop(self) -> None:
        while not self._stop.wait(self.settings.heartbeat_s):
            try:
                lapsed = self._beat(first=False)
            except redis.RedisError as exc:
                self.janitor.in_contact(False)
                log.warning("dispatcher %s: heartbeat failed: %s", self.owner, exc)
                continue
            if self.lost.is_set():
                return
            trusted_view = self.janitor.in_contact(True)
            if lapsed and trusted_view:
                self.janitor.sweep(lapsed, self.live)
            if self._producers_lapsed and trusted_view:
                self.janitor.abandon(self._producers_lapsed)

    def _beat(self, *, first: bool) -> list[str]:
        keys = self.settings.keys
        reply = heartbeat_script(
            self.conn,
            [keys.leases(), keys.hosts(), keys.producers()],
            [self.owner, self.settings.lease_s, "1" if first else "0", self.host],
        )
        if int(reply[0]) < 0:
            log.warning(
                "dispatcher %s: its lease lapsed and its snippets were released elsewhere; "
                "stopping",
                self.owner,
            )
            self.lost.set()
            with self._renewed:
                self._renewed.notify_all()
            self.on_lost()
            return []
        self.live = max(1, int(reply[1]))
        self._producers_lapsed = list(reply[3])
        with self._renewed:
            self._last_ok = time.monotonic()
            self._renewed.notify_all()
        return [owner.decode() if isinstance(owner, bytes) else str(owner) for owner in reply[2]]
