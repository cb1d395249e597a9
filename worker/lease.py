"""Leases: a worker host holds one lease, its score in ``hosts``, which is the lease of
all its dispatchers too: its beat renews it in one small script call
(``ledger.HOST_BEAT``) whatever its slot count, and now and then it is the fleet's
janitor; each dispatcher reads the outcome from the host's lease board
(worker/lease_board.py).

A host's lease is per start, ``host~{token}`` (``host~{token}.N`` after N losses): a
host killed -9 and started again at once under the same name (a container restart, a
systemd unit) is a new lease, and its start's first beat names the lease it replaces,
which it fences at once with that start's dispatchers, releasing what they held.

A dispatcher is registered under the host's lease once, when it starts. Each host runs
the janitor's round about every ``live hosts`` beats, and not more often than about once
a lease, so a fleet of ``lease_s / heartbeat_s`` hosts or more looks about once a beat,
a smaller one less often (a lone host about once a lease). A dispatcher the host sees
exit, clean or not, is fenced and what it still held released at once (a clean exit
gave back what it claimed; one whose give-back failed did not), retried each beat until
it succeeds. A host whose lease lapsed (killed, frozen, cut off) is
fenced by a janitor with all its dispatchers; if it comes back, it stops them and starts
afresh.

The dispatcher side keeps what its writer needs (``confirm``): the lease certainly holds
while the last answered beat is younger than the lease less a margin; after a freeze or
a partition, the writer waits for the next beat's verdict, and a fenced dispatcher
writes nothing more.
"""

from __future__ import annotations

import logging
import random
import secrets
import threading
import time
from collections.abc import Callable

import redis

from codepool.common.janitor import Janitor
from codepool.common.ledger import host_beat, leave_script
from codepool.common.settings import Settings
from codepool.worker.lease_board import EMPTY, HELD, LOST, PENDING, LeaseBoard

log = logging.getLogger(__name__)

# The writer trusts the lease for this much less than its length (clock rates, latency).
TRUST_MARGIN_S = 1.5
# A dispatcher waits this long for its host to take its lease before it gives up.
HELD_TIMEOUT_S = 30.0
POLL_S = 0.01
# Without a deadline, how long a stop waits for the last settle and the LEAVE.
STOP_WAIT_S = 10.0
# A host's janitor's rounds come this many periods apart (``janitor_period_s``), drawn
# at random, so that the hosts of a fleet do not all look at once.
JANITOR_SPREAD = (0.5, 1.5)


def janitor_period_s(settings: Settings, live_hosts: int) -> float:
    """A host's mean time between janitor's rounds (seconds): about one round a beat
    across the fleet, and no host more often than about once a lease (a fleet smaller
    than ``lease_s / heartbeat_s`` hosts looks less often than once a beat)."""
    return max(settings.lease_s, live_hosts * settings.heartbeat_s)


class HostLease:
    """The lease of worker host ``host``, which is its dispatchers' too, renewed every
    ``settings.heartbeat_s`` on ``conn`` (a client with short timeouts: a beat that
    waits long is worse than one that fails). ``on_lost(slot)`` runs, from the beat's
    thread, for each dispatcher when the host's lease was taken away (the host then
    takes a lease anew, under a new name, for the dispatchers it starts next)."""

    def __init__(
        self,
        conn: redis.Redis,
        settings: Settings,
        *,
        host: str,
        slots: int,
        board: LeaseBoard,
        on_lost: Callable[[int], None],
    ) -> None:
        self.conn = conn
        self.settings = settings
        self.host = host
        self.slots = slots  # registered with the lease: batches are announced by them
        self.start_token = secrets.token_hex(4)  # this start's
        self.name = f"{host}~{self.start_token}"  # the lease's: host~{token}[.N after N losses]
        self._losses = 0
        self._started = False  # this start's first lease is taken (its predecessor named)
        self._replaced: list[str] = []  # previous starts' leases to fence and release
        self.board = board
        self.on_lost = on_lost
        self.janitor = Janitor(conn, settings, name=host)
        self._lock = threading.Lock()
        self._held: dict[int, str] = {}  # slot -> registered dispatcher
        self._new: dict[int, str] = {}  # slot -> dispatcher to register
        self._exits: list[tuple[str, bool]] = []  # (owner, died) to settle
        self._taken = False  # the lease under self.name is taken
        self._unsettled = False  # an exit could not be settled: leave the lease to lapse
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._beats = 0
        self._next_beat = 0.0  # monotonic
        self._janitor_at = 0.0  # monotonic time of the next janitor's round
        self._failing = False
        self._thread = threading.Thread(target=self._loop, name="codepool-lease", daemon=True)

    @property
    def start_id(self) -> str:
        """This start's identity, ``host~{token}``: what it lists its lone calls in
        flight under (a janitor puts them back when it fences any of its leases)."""
        return f"{self.host}~{self.start_token}"

    def start(self) -> None:
        self._thread.start()

    def add(self, slot: int, owner: str) -> None:
        """Register dispatcher ``owner`` (in ``slot``) at once; it waits for that."""
        with self._lock:
            self._new[slot] = owner
            self.board.set(slot, PENDING)
        self._wake.set()

    def remove(self, slot: int, owner: str, *, died: bool) -> None:
        """Dispatcher ``owner`` exited: it is unregistered (a clean exit gave back what
        it held), or, if it ``died``, fenced and its work released now. One lost with
        the host's lease is the janitor's already."""
        with self._lock:
            if self._held.get(slot) == owner:
                del self._held[slot]
                if self.board.state(slot) != LOST:
                    self._exits.append((owner, died))
            if self._new.get(slot) == owner:
                del self._new[slot]
            self.board.set(slot, EMPTY)
        self._wake.set()

    def stop(self, until: float | None = None) -> None:
        """Stop beating; the beat's thread then settles the exits left (the dispatchers
        are gone by now) and gives the lease up, unless something could not be settled:
        then it lapses and a janitor releases what is left. Waits for that until the
        monotonic time ``until`` (the drain deadline) at most: a Redis that does not
        answer by then leaves the lease to lapse, and the host exits on time."""
        self._stop.set()
        self._wake.set()
        if not self._thread.is_alive():  # never started, or already done
            if self._thread.ident is None:
                self._leave()
            return
        wait_s = STOP_WAIT_S if until is None else max(0.0, until - time.monotonic())
        self._thread.join(timeout=wait_s)
        if self._thread.is_alive():
            log.warning(
                "worker %s: Redis did not answer before the drain deadline; its lease is "
                "left to lapse (a janitor releases what it held)",
                self.host,
            )

    def _leave(self) -> None:
        self._settle_exits()
        self._fence_replaced()
        with self._lock:
            self._unsettled = self._unsettled or bool(self._exits) or bool(self._replaced)
        if not self._taken or self._unsettled:
            return
        keys = self.settings.keys
        try:
            leave_keys = [keys.hosts(), keys.host_owners(self.name), keys.host_slots()]
            leave_script(self.conn, [*leave_keys, keys.fleet()], [self.name])
        except redis.RedisError as exc:
            log.warning("worker %s: could not give its lease up: %s", self.host, exc)

    def tick(self) -> float:
        """One turn of the beat's thread: settle exits, beat if one is due (or a
        dispatcher is to be registered); returns the monotonic time of the next beat.
        (The fleet simulator, ops/bench/fleet_sim.py, drives many hosts' ticks.)"""
        self._settle_exits()
        self._fence_replaced()
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
        self._leave()

    def _beat(self) -> None:
        with self._lock:
            new = dict(self._new)
        now = time.monotonic()
        sent_ns = time.monotonic_ns()  # the lease holds from when the beat left, at most
        janitor = now >= self._janitor_at
        try:
            beat = host_beat(
                self.conn,
                self.settings.keys,
                host=self.name,
                lease_s=self.settings.lease_s,
                first=not self._taken,
                slots=self.slots,
                new=list(new.values()),
                janitor=janitor,
                start_of=self.host,
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
        trusted = self.janitor.in_contact(True, sent_at=now, server_time=beat.server_time)
        lost_slots: list[int] = []
        with self._lock:
            if not self._taken and not beat.lost:
                if beat.replaced and not self._started:  # a start killed -9 before us
                    self._replaced.append(beat.replaced)
                self._started = True
            if beat.lost:
                lost_slots = sorted(self._held) + sorted(self._new)
                for slot in lost_slots:
                    self.board.set(slot, LOST)
                self._held.clear()
                self._new.clear()
                self._losses += 1
                self.name = f"{self.host}~{self.start_token}.{self._losses}"
                self._taken = False
            else:
                self._taken = True
                for slot, owner in new.items():
                    if self._new.get(slot) == owner:
                        del self._new[slot]
                        self._held[slot] = owner
                        self.board.set(slot, HELD)
        self.board.answered(beat.live, sent_ns=sent_ns)
        if beat.lost:
            log.warning(
                "worker %s: its lease lapsed and its snippets were released elsewhere; "
                "stopping its %d dispatchers",
                self.host,
                len(lost_slots),
            )
        for slot in lost_slots:
            self.on_lost(slot)
        if not janitor:
            return
        period = janitor_period_s(self.settings, self.board.live())
        self._janitor_at = now + period * random.uniform(*JANITOR_SPREAD)
        if trusted and beat.lapsed:
            self.janitor.sweep(beat.lapsed, self.board.live())
        if trusted and beat.lapsed_producers:
            self.janitor.abandon(beat.lapsed_producers)

    def _settle_exits(self) -> None:
        """Fence each exited dispatcher and release what it still held (nothing, after
        a clean give-back), then unregister it; what fails is tried again next time."""
        with self._lock:
            exits, self._exits = self._exits, []
            name = self.name
        keys = self.settings.keys
        for at, (owner, died) in enumerate(exits):
            try:
                self.janitor.recover(owner, self.board.live(), dead=True, died=died)
                self.conn.srem(keys.host_owners(name), owner)
            except redis.RedisError as exc:
                # Still registered under the host's lease: settled on a later turn, or,
                # if that lease lapses first, by a janitor with the host.
                with self._lock:
                    self._exits[:0] = exits[at:]
                log.warning("worker %s: could not settle exited dispatchers: %s", self.host, exc)
                return

    def _fence_replaced(self) -> None:
        """Fence the lease of this host's previous start (killed, never stopped) and
        release what its dispatchers held; tried again next turn if Redis fails."""
        with self._lock:
            replaced = list(self._replaced)
        for lease in replaced:
            try:
                released = self.janitor.recover(lease, self.board.live(), dead=True)
            except redis.RedisError as exc:
                log.warning("worker %s: could not fence its previous start: %s", self.host, exc)
                return
            with self._lock:
                self._replaced.remove(lease)
            log.warning(
                "worker %s: started again: fenced its previous start's lease %s (%d "
                "snippets released)",
                self.host,
                lease,
                released,
            )


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
