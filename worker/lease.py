"""Leases: the worker host keeps those of all its dispatchers, in one Redis call a beat
(``ledger.HOST_BEAT``), and is the fleet's janitor now and then; each dispatcher reads
the outcome from the host's lease board (worker/lease_board.py).

What an idle host costs Redis therefore does not grow with its slots: one small script
a beat for every dispatcher and the host itself, the janitor's round spread over the
fleet (each host looks about every ``live hosts`` beats, at least every lease, so the
fleet as a whole looks about once a beat). A dispatcher the host sees die is fenced and
its claims released at once; one that exits cleanly gave back what it claimed, and its
lease is given up.

The dispatcher side keeps what its writer needs (``confirm``): the lease certainly holds
while the last answered beat is younger than the lease less a margin; after a freeze or
a partition, the writer waits for the next beat's verdict, and a fenced dispatcher
writes nothing more.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable

import redis

from codepool.common.janitor import Janitor
from codepool.common.ledger import host_beat
from codepool.common.settings import Settings
from codepool.worker.lease_board import EMPTY, HELD, LOST, PENDING, LeaseBoard

log = logging.getLogger(__name__)

# The writer trusts the lease for this much less than its length (clock rates, latency).
TRUST_MARGIN_S = 1.5
# The host renews its own score in the live hosts every this many beats (well within a
# lease: a host is live while its score is younger than the lease).
HOST_EVERY_BEATS = 3
# A dispatcher waits this long for its host to take its lease before it gives up.
HELD_TIMEOUT_S = 30.0
POLL_S = 0.01


class HostLease:
    """The leases of worker host ``host``'s dispatchers, renewed every
    ``settings.heartbeat_s`` on ``conn`` (a client with short timeouts: a beat that
    waits long is worse than one that fails). ``on_lost(slot)`` runs, from the beat's
    thread, for a dispatcher whose lease was taken away."""

    def __init__(
        self,
        conn: redis.Redis,
        settings: Settings,
        *,
        host: str,
        board: LeaseBoard,
        on_lost: Callable[[int], None],
    ) -> None:
        self.conn = conn
        self.settings = settings
        self.host = host
        self.board = board
        self.on_lost = on_lost
        self.janitor = Janitor(conn, settings, name=host)
        self._lock = threading.Lock()
        self._held: dict[int, str] = {}  # slot -> owner renewed each beat
        self._new: dict[int, str] = {}  # slot -> owner whose lease is to be taken
        self._exits: list[tuple[str, bool]] = []  # (owner, died) to settle
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._beats = 0
        self._next_beat = 0.0  # monotonic
        self._janitor_at = 0.0  # monotonic time of the next janitor's round
        self._failing = False
        self._thread = threading.Thread(target=self._loop, name="codepool-lease", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def add(self, slot: int, owner: str) -> None:
        """Take a lease for dispatcher ``owner`` (in ``slot``) at once; it waits for it."""
        with self._lock:
            self._new[slot] = owner
            self.board.set(slot, PENDING)
        self._wake.set()

    def remove(self, slot: int, owner: str, *, died: bool) -> None:
        """Dispatcher ``owner`` exited: its lease is given up (a clean exit gave back
        what it held), or, if it ``died``, it is fenced and its work released now. A
        fenced one is the janitor's already."""
        with self._lock:
            if self._held.get(slot) == owner:
                del self._held[slot]
            if self._new.get(slot) == owner:
                del self._new[slot]
            if self.board.state(slot) != LOST:
                self._exits.append((owner, died))
            self.board.set(slot, EMPTY)
        self._wake.set()

    def stop(self) -> None:
        """Stop beating, and settle the exits left (the dispatchers are gone by now):
        one pipeline for the clean ones, the dead ones until Redis fails once."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self._settle_exits()

    def tick(self) -> float:
        """One turn of the beat's thread: settle exits, beat if one is due (or a lease
        is to be taken); returns the monotonic time of the next beat. (The fleet
        simulator, ops/bench/fleet_sim.py, drives many hosts' ticks from few threads.)"""
        self._settle_exits()
        now = time.monotonic()
        with self._lock:
            new = bool(self._new)
        if new or now >= self._next_beat:
            self._next_beat = now + self.settings.heartbeat_s
            self._beat()
        return self._next_beat

    def _loop(self) -> None:
        while not self._stop.is_set():
            next_beat = self.tick()
            self._wake.wait(max(0.0, next_beat - time.monotonic()))
            self._wake.clear()

    def _beat(self) -> None:
        with self._lock:
            new, held = dict(self._new), dict(self._held)
        now = time.monotonic()
        janitor = now >= self._janitor_at
        renew_host = self._beats % HOST_EVERY_BEATS == 0 or bool(new)
        try:
            beat = host_beat(
                self.conn,
                self.settings.keys,
                host=self.host if renew_host else "",
                lease_s=self.settings.lease_s,
                new=list(new.values()),
                kept=list(held.values()),
                janitor=janitor,
            )
        except redis.RedisError as exc:
            self.janitor.in_contact(False)
            if not self._failing:  # once per outage, not once a second
                log.warning("worker %s: heartbeat failed: %s", self.host, exc)
            self._failing = True
            return
        if self._failing:
            log.info("worker %s: heartbeats answered again", self.host)
        self._failing = False
        self._beats += 1
        trusted = self.janitor.in_contact(True)
        lost_slots = []
        with self._lock:
            for slot, owner in new.items():
                if self._new.get(slot) == owner:
                    del self._new[slot]
                    self._held[slot] = owner
                    self.board.set(slot, HELD)
            for owner in beat.lost:
                for slot, held_owner in list(self._held.items()):
                    if held_owner == owner:
                        del self._held[slot]
                        self.board.set(slot, LOST)
                        lost_slots.append(slot)
        self.board.answered(beat.live)
        for slot in lost_slots:
            log.warning(
                "worker %s: dispatcher %d's lease lapsed and its snippets were released "
                "elsewhere; stopping it",
                self.host,
                slot,
            )
            self.on_lost(slot)
        if not janitor:
            return
        # About one round a beat across the fleet, at least one a lease per host.
        period = max(self.settings.lease_s, self.board.live() * self.settings.heartbeat_s)
        self._janitor_at = now + period * random.uniform(0.5, 1.5)
        if trusted and beat.lapsed:
            self.janitor.sweep(beat.lapsed, self.board.live())
        if trusted and beat.lapsed_producers:
            self.janitor.abandon(beat.lapsed_producers)

    def _settle_exits(self) -> None:
        with self._lock:
            exits, self._exits = self._exits, []
        if not exits:
            return
        clean = [owner for owner, died in exits if not died]
        keys = self.settings.keys
        try:
            if clean:
                with self.conn.pipeline(transaction=False) as pipe:
                    pipe.zrem(keys.leases(), *clean)
                    for owner in clean:
                        pipe.delete(keys.owner_batches(owner))
                    pipe.execute()
            for owner, died in exits:
                if died:
                    self.janitor.recover(owner, self.board.live(), dead=True)
        except redis.RedisError as exc:
            # Not renewed, their leases lapse and a janitor recovers them.
            log.warning("worker %s: could not settle exited dispatchers: %s", self.host, exc)


class DispatcherLease:
    """Dispatcher ``owner``'s view of the lease its host keeps for it in ``slot`` of
    ``board``; ``janitor`` gives back what it claimed and will not run."""

    def __init__(
        self,
        conn: redis.Redis,
        settings: Settings,
        *,
        owner: str,
        board: LeaseBoard,
        slot: int,
    ) -> None:
        self.settings = settings
        self.owner = owner
        self.board = board
        self.slot = slot
        self.janitor = Janitor(conn, settings, name=owner)

    @property
    def live(self) -> int:
        """Live worker hosts, as the host's last janitor's round counted them."""
        return self.board.live()

    def held(self, timeout_s: float = HELD_TIMEOUT_S) -> bool:
        """Wait until the host holds this dispatcher's lease; False if it was lost, or
        not taken within ``timeout_s`` (Redis cannot be reached)."""
        deadline = time.monotonic() + timeout_s
        while (state := self.board.state(self.slot)) != HELD:
            if state == LOST or time.monotonic() > deadline:
                return False
            time.sleep(POLL_S)
        return True

    def is_lost(self) -> bool:
        """The lease was taken away: what this dispatcher held runs elsewhere."""
        return self.board.state(self.slot) == LOST

    def trusted(self) -> bool:
        """True while the lease certainly holds (no Redis round trip)."""
        fresh = self.board.age_s() < self.settings.lease_s - TRUST_MARGIN_S
        return fresh and self.board.state(self.slot) == HELD

    def confirm(self, timeout_s: float) -> bool:
        """True if the lease holds: at once when trusted, else after the host's next
        answered beat. False if it was lost, or no verdict came within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not self.trusted():
            if self.is_lost() or time.monotonic() >= deadline:
                return False
            time.sleep(min(POLL_S * 5, max(0.0, deadline - time.monotonic())))
        return True
