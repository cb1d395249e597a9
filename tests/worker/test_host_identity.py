"""A worker host's identity is per start, driven here through its lease (worker/lease.py)
on a real Redis, no processes: a start that replaces one of the same name fences it and
releases what its dispatchers claimed, and a clean stop of the new start does not strand
them; every dispatcher exit, clean or not, releases what it still held; a host that lost
its lease and took one anew still counts as live for its contexts."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from codepool.common.keys import Keys
from codepool.common.settings import Settings
from codepool.producer import CodePool
from codepool.producer.context import host_lives
from codepool.worker.lease import HostLease
from codepool.worker.lease_board import LeaseBoard
from tests.common.test_ledger import _claim, _store


@pytest.fixture
def conn(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def _lease(conn: redis.Redis, url: str, tmp_path: Path, tag: str, host: str = "h") -> HostLease:
    board = LeaseBoard(str(tmp_path / f"board-{tag}"), 2, create=True)
    return HostLease(
        conn, Settings(redis_url=url), host=host, slots=2, board=board, on_lost=lambda _: None
    )


def _retried(conn: redis.Redis, batch_id: str) -> list[int]:
    return sorted(int(i) for i in conn.lrange(Keys().batch_retry(batch_id), 0, -1))


def test_a_restart_under_the_same_name_fences_the_old_start_even_past_a_clean_leave(
    conn: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    settings = Settings(redis_url=redis_url)
    old = _lease(conn, redis_url, tmp_path, "old")
    old.add(0, "h.0.old")
    old.tick()
    batch_id = _store(conn, settings, 10)
    held = _claim(conn, settings, batch_id, "h.0.old", room=3)
    assert held
    # The old start is killed -9 (its lease is simply never renewed); a new one starts.
    new = _lease(conn, redis_url, tmp_path, "new")
    new.add(0, "h.0.new")
    new.tick()  # its first beat names the old start's lease
    new.tick()  # ... which it fences, releasing its dispatchers' claims
    assert _retried(conn, batch_id) == sorted(held)
    assert conn.zscore(Keys().leases(), "h.0.old") is None
    assert conn.zscore(Keys().hosts(), old.name) is None
    # The new start stops cleanly at once: its own owners go, nothing of the old is left.
    new.remove(0, "h.0.new", died=False)
    new.stop()
    assert conn.zcard(Keys().hosts()) == 0 and conn.zcard(Keys().fenced()) == 0
    assert not conn.exists(Keys().host_owners(old.name), Keys().host_owners(new.name))


def test_a_clean_exit_releases_what_its_give_back_left(
    conn: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    """A dispatcher whose give-back failed (Redis blipped, its writer gave up) still
    exits 0; what it held is released all the same (before: only unregistered)."""
    settings = Settings(redis_url=redis_url)
    lease = _lease(conn, redis_url, tmp_path, "one")
    lease.add(0, "h.0.a")
    lease.tick()
    batch_id = _store(conn, settings, 10)
    held = _claim(conn, settings, batch_id, "h.0.a", room=4)
    assert held
    lease.remove(0, "h.0.a", died=False)
    lease.tick()
    assert _retried(conn, batch_id) == sorted(held)
    assert conn.zscore(Keys().leases(), "h.0.a") is None
    assert not conn.sismember(Keys().host_owners(lease.name), "h.0.a")
    lease.stop()


def test_a_host_that_took_its_lease_anew_still_lives_for_its_contexts(
    conn: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    lease = _lease(conn, redis_url, tmp_path, "back", host="ctxh")
    lease.add(0, "ctxh.0.a")
    lease.tick()
    pool = CodePool(redis_url)
    assert host_lives(pool, "ctxh")
    conn.zrem(Keys().hosts(), lease.name)  # fenced while it was away
    conn.zadd(Keys().fenced(), {lease.name: 1.0})
    lease._next_beat = 0.0
    lease.tick()  # learns it was lost: ctxh~{token}.1
    lease._next_beat = 0.0
    lease.tick()  # takes it anew
    assert lease.name.endswith(".1") and conn.zscore(Keys().hosts(), lease.name) is not None
    assert host_lives(pool, "ctxh")
    lease.stop()
    pool.close()


def test_fencing_a_start_puts_back_its_lone_calls_and_leaves_the_new_starts(
    conn: redis.Redis, redis_url: str
) -> None:
    """Lone calls in flight are listed per start (``host~{token}``): fencing a dead
    start's lease (or its ``.N`` re-lease) puts its calls back on the call list and
    leaves those the new start of the same name took (before: one list per host name,
    so the new start's calls were put back too, and ran twice)."""
    from codepool.common.janitor import Janitor, start_of
    from codepool.common.lone_calls import LoneCall

    keys = Keys()
    old_call = LoneCall("c-old", keys.inbox("p"), "print(1)", {}).encode()
    new_call = LoneCall("c-new", keys.inbox("p"), "print(2)", {}).encode()
    conn.rpush(keys.host_calls("h~old"), old_call)
    conn.rpush(keys.host_calls("h~new"), new_call)
    conn.zadd(keys.hosts(), {"h~old.1": 1.0})  # the dead start's lease, lapsed
    janitor = Janitor(conn, Settings(redis_url=redis_url), name="j")
    janitor.recover("h~old.1", live=1, dead=True)
    assert [LoneCall.decode(d).id for d in conn.lrange(keys.calls(), 0, -1)] == ["c-old"]
    assert conn.llen(keys.host_calls("h~new")) == 1
    assert (start_of("h~old.1"), start_of("h~old"), start_of("h.0.abc")) == ("h~old", "h~old", "")
