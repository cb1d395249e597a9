"""Leases under a clock that jumps: when Redis's wall clock steps past a lease while
everyone lives, a janitor does not take the live for lapsed (it distrusts lapses for a
lease once Redis's time ran ahead of its own); a producer that really stops is still
found lapsed afterwards. Real Redis with a fake clock (tests/fake_clock.py)."""

from __future__ import annotations

import time
from pathlib import Path

import redis

from codepool.common.settings import Settings
from codepool.producer import CodePool
from tests.conftest import poll_until, wait_until
from tests.fake_clock import redis_with_fake_clock

LEASE_S = 3.0


def _look(pool: CodePool) -> int | None:
    """One janitor round of ``pool``'s now (its rounds are at most one a second)."""
    pool._watched_at = -1e9
    return pool.watch()


def _looking_for(pool: CodePool, seconds: float) -> None:
    ends = time.monotonic() + seconds
    poll_until(lambda: _look(pool) is None or time.monotonic() >= ends, seconds + 5)


def test_a_jump_of_redis_time_does_not_cancel_a_live_producers_batch(tmp_path: Path) -> None:
    # Failed before the fix: the first round after the jump found the live producer's
    # lease lapsed and cancelled its batch.
    with redis_with_fake_clock(tmp_path) as (server, clock):
        settings = Settings.from_env(redis_url=server.url).replace(lease_s=LEASE_S)
        conn = redis.Redis.from_url(server.url)
        producer = CodePool(settings=settings)
        batch = producer.submit(["print(1)"] * 3, run="jump")  # no worker: in flight
        watcher = CodePool(settings=settings)  # waits on nothing, looks as a janitor
        _looking_for(watcher, 1.5 * LEASE_S)  # in contact for a lease: lapses trusted
        state = settings.keys.batch_state(batch.id)
        assert conn.hget(state, "cancelled") is None
        clock.jump(10 * LEASE_S)  # returns once Redis's TIME shows it
        _looking_for(watcher, 2 * LEASE_S)
        assert conn.hget(state, "cancelled") is None, "a live producer's batch was cancelled"
        # A producer that stops beating is found lapsed once the lease of distrust is over.
        producer.lease.stop()
        wait_until(
            lambda: _look(watcher) is not None and conn.hget(state, "cancelled") == b"3",
            6 * LEASE_S,
            what="the stopped producer's batch cancelled",
        )
        watcher.close()
        producer.close()
        conn.close()
