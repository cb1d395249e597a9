"""Recovering a lapsed worker host's work: fence it and its dispatchers, release what
they had not finished, announce the released work, and tidy RQ's records of them. What
they finished was counted when it was written (common/tally.py). A lapsed producer's
batches are cancelled: nobody waits for them any more (common/cancellation.py).

Worker hosts run this from their beats (worker/lease.py), and a producer while it
waits, so a batch recovers whether or not its own producer is still there. Every step
is idempotent: two janitors on the same lapsed dispatcher release its work once.
"""

from __future__ import annotations

import logging
import time
from typing import cast

import redis

from codepool.common import failover, lone_counts
from codepool.common.cancellation import PRODUCER_LOST_MESSAGE, cancel
from codepool.common.codec import MsgpackSerializer
from codepool.common.ledger import (
    abandon_script,
    fence_script,
    forget_script,
    release_script,
    write_script,
)
from codepool.common.lone_calls import requeue_host_calls
from codepool.common.queueing import announce, announcements_for, batch_of_job, batch_queue
from codepool.common.result import infra
from codepool.common.rq_records import retire_worker
from codepool.common.settings import Settings
from codepool.common.tally import write_calls

log = logging.getLogger(__name__)

LOST_MESSAGE = "codepool: the worker running this snippet was lost {runs} times; not run again"
# How far Redis's clock may run ahead of ours between two beats (beyond the beat's own
# round trip) before it counts as a jump (seconds).
CLOCK_SLACK_S = 0.5


def start_of(lease: str) -> str:
    """The start a worker host's lease belongs to: ``host~{token}`` for ``host~{token}``
    and ``host~{token}.N``; '' for a dispatcher's name (it has no ``~``)."""
    host, sep, tail = lease.rpartition("~")
    return f"{host}~{tail.split('.')[0]}" if sep else ""


class Janitor:
    """Recovers lapsed dispatchers. ``name`` says who did it, in logs and results."""

    def __init__(self, conn: redis.Redis, settings: Settings, *, name: str) -> None:
        self.conn = conn
        self.settings = settings
        self.keys = settings.keys
        self.name = name
        self.queue = batch_queue(conn, settings)
        self._contact_since: float | None = None
        self._clock: tuple[float, float] | None = None  # (our send time, Redis's time)
        self._generation = failover.generation(conn)  # moves of a Sentinel's primary

    def in_contact(
        self, ok: bool, *, sent_at: float | None = None, server_time: float | None = None
    ) -> bool:
        """Note whether the caller's last Redis round trip worked; True once it has
        worked for a whole lease, on the same primary (a Sentinel failover starts the
        count anew), and Redis's clock has not jumped ahead of ours meanwhile. Only then
        may lapses be trusted: after a Redis restart, a failover or a partition of our
        own, everyone looks lapsed for a moment, and so they do when Redis's clock jumps
        past a lease (an NTP step, a restart on a host whose clock is ahead) while they
        live. ``sent_at``: when the round trip left (time.monotonic()); ``server_time``:
        Redis's TIME in it (a beat's ``HostBeat.server_time``)."""
        generation = failover.generation(self.conn)
        if generation != self._generation:
            self._generation, self._contact_since = generation, None
        now = time.monotonic()
        if not ok:
            self._contact_since = None
            return False
        if sent_at is not None and server_time is not None:
            self._watch_clock(sent_at, server_time, round_trip_s=now - sent_at)
        if self._contact_since is None:
            self._contact_since = now
        return now - self._contact_since >= self.settings.lease_s

    def _watch_clock(self, sent_at: float, server_time: float, *, round_trip_s: float) -> None:
        """Start the count of trust anew when Redis's clock ran ahead of ours since the
        last round trip by more than this one took (and a slack): what lapsed then may
        be alive, and its next beat, in Redis's new time, says so within a lease."""
        if self._clock is not None:
            last_sent, last_server = self._clock
            ahead_s = (server_time - last_server) - (sent_at - last_sent)
            if ahead_s > round_trip_s + CLOCK_SLACK_S:
                log.warning(
                    "janitor %s: Redis's clock jumped %.1f s ahead of ours; lapses are not "
                    "trusted for a lease",
                    self.name,
                    ahead_s,
                )
                self._contact_since = None
        self._clock = (sent_at, server_time)

    def sweep(self, lapsed: list[str], live: int) -> int:
        """Recover each lapsed worker host (and each fenced one a janitor left
        unreleased); returns how many snippets were released."""
        released = 0
        for raw in lapsed:
            name = raw.decode() if isinstance(raw, bytes) else str(raw)
            try:
                released += self.recover(name, live)
            except redis.RedisError as exc:
                log.warning("janitor %s: recovering %s failed: %s", self.name, name, exc)
        return released

    def abandon(self, lapsed: list[str]) -> int:
        """Cancel the batches of each lapsed producer (``HOST_BEAT``'s round);
        returns how many snippets were cancelled."""
        keys, cancelled = self.keys, 0
        for raw in lapsed:
            producer = raw.decode() if isinstance(raw, bytes) else str(raw)
            try:
                batches = abandon_script(
                    self.conn,
                    [keys.producers(), keys.producer_batches(producer)],
                    [producer, self.settings.lease_s],
                )
                for batch in batches:
                    batch_id = batch.decode() if isinstance(batch, bytes) else str(batch)
                    run = self.conn.hget(keys.batch_state(batch_id), "run")
                    tag = run.decode() if isinstance(run, bytes) else ""
                    count = cancel(
                        self.conn,
                        self.settings,
                        batch_id,
                        run=tag,
                        message=PRODUCER_LOST_MESSAGE,
                    )
                    cancelled += max(0, count)
            except redis.RedisError as exc:
                log.warning("janitor %s: abandoning %s failed: %s", self.name, producer, exc)
                continue
            if batches:
                log.warning(
                    "janitor %s: producer %s lapsed; cancelled its %d batches in flight",
                    self.name,
                    producer,
                    len(batches),
                )
        return cancelled

    def recover(self, name: str, live: int, *, dead: bool = False, died: bool = True) -> int:
        """Fence a lapsed worker host and each of its dispatchers, or one dispatcher
        (``dead``: at once, whatever its lease: its own worker host saw it exit, or a
        host's new start replaced it), and release what they had not finished; returns
        how many snippets. ``died=False``: the dispatcher exited cleanly (the log says
        so)."""
        keys = self.keys
        if not self._fence(name, 0 if dead else self.settings.lease_s):
            return 0  # it came back, or another janitor finished it
        owners = sorted(
            o.decode() for o in cast(set[bytes], self.conn.smembers(keys.host_owners(name)))
        )
        released = 0
        for owner in owners:
            self._fence(owner, 0)
            released += self._release_all(owner, live)
        released += self._release_all(name, live)
        # Its lone calls (common/lone_calls.py) are listed under its start's lease.
        start = start_of(name)
        if start:
            requeue_host_calls(self.conn, keys, start, janitor=self.name)
            lone_counts.fold(self.conn, keys, start)  # the counts of what it answered
        if owners:
            log.warning(
                "janitor %s: worker host %s lapsed; released %d snippets of its %d dispatchers",
                self.name,
                name,
                released,
                len(owners),
            )
        elif released:
            what = ("died" if died else "exited") if dead else "lapsed"
            log.warning(
                "janitor %s: dispatcher %s %s; released %d", self.name, name, what, released
            )
        return released

    def _fence(self, name: str, lease_s: float) -> bool:
        k = self.keys
        keys = [k.hosts(), k.leases(), k.fenced(), k.host_slots(), k.fleet()]
        return bool(fence_script(self.conn, keys, [name, lease_s]))

    def _release_all(self, name: str, live: int) -> int:
        """Release what fenced ``name`` claimed and did not finish, then forget it."""
        keys = self.keys
        batches = {
            b.decode() for b in cast(set[bytes], self.conn.smembers(keys.owner_batches(name)))
        }
        held = self._retire_rq_worker(name)
        released = 0
        for batch_id in sorted(batches | ({held} if held else set())):
            released += self.release(
                batch_id, name, live, graceful=False, announce_anyway=batch_id == held
            )
        forget_keys = [keys.fenced(), keys.owner_batches(name), keys.host_owners(name)]
        forget_script(self.conn, forget_keys, [name])
        return released

    def release(
        self, batch_id: str, owner: str, live: int, *, graceful: bool, announce_anyway: bool = False
    ) -> int:
        """Give ``owner``'s unfinished snippets of a batch back and announce them."""
        keys = self.keys
        reply = release_script(
            self.conn,
            [
                keys.batch_state(batch_id),
                keys.batch_retry(batch_id),
                keys.batch_results(batch_id),
                keys.batch_done(batch_id),
                keys.open_batches(),
            ],
            [owner, "1" if graceful else "0", self.settings.batch_ttl_s, batch_id],
        )
        released, fresh, reruns = int(reply[0]), int(reply[4]), int(reply[5])
        # reply[1], what it finished, was counted with its write: nothing to do for it.
        exhausted: list[int] = [int(i) for i in reply[2]]
        run = reply[3].decode() if isinstance(reply[3], bytes) else str(reply[3])
        if released < 0:
            return 0  # the batch is gone (expired)
        if exhausted:
            self._give_up(batch_id, run, exhausted, runs=reruns + 1)
        if released or (announce_anyway and fresh > 0):
            announce(
                self.queue,
                self.settings,
                batch_id=batch_id,
                size=max(1, released),
                count=announcements_for(released, live),
            )
        return released

    def _give_up(self, batch_id: str, run: str, indices: list[int], *, runs: int) -> None:
        result = infra(LOST_MESSAGE.format(runs=runs), worker=self.name)
        for call_keys, args in write_calls(
            self.keys,
            batch_id,
            [(index, result) for index in indices],
            worker="",
            run=run,
            batch_ttl_s=self.settings.batch_ttl_s,
            minute_ttl_s=self.settings.minute_stats_ttl_s,
        ):
            write_script(self.conn, call_keys, args)
        log.warning(
            "janitor %s: batch %s: %d snippets lost too often", self.name, batch_id, len(indices)
        )

    def _retire_rq_worker(self, owner: str) -> str | None:
        """Take a lost dispatcher out of RQ's worker list and its job out of RQ's started
        registry; returns the batch of the job it held, if any (it may have held the
        only announcement of that batch)."""
        job_id = retire_worker(
            self.conn,
            owner,
            queue=self.queue.name,
            serializer=MsgpackSerializer,
            job_ttl_s=self.settings.job_failure_ttl_s,
        )
        return batch_of_job(job_id) if job_id else None
