"""Cancellation in the ledger, against a real redis-server: every index is counted once,
as a call or as cancelled, whichever of its write and its cancellation comes first; a
cancelled index is never claimed nor written; the dispatchers holding claims hear of it;
a lapsed producer's batches are taken once."""

from __future__ import annotations

import redis

from codepool.common import codec, counters
from codepool.common.cancellation import cancel, parse_message
from codepool.common.janitor import Janitor
from codepool.common.ledger import (
    abandon_script,
    host_beat,
    parse_indices,
    producer_beat_script,
    release_script,
)
from codepool.common.result import ExecResult
from codepool.common.settings import Settings
from codepool.common.wire import new_batch_id
from tests.common.test_ledger import _beat, _claim_reply, _settings, _store, _write_many
from tests.conftest import wait_until


def _claim(
    conn: redis.Redis, settings: Settings, batch_id: str, owner: str, room: int
) -> list[int]:
    reply = _claim_reply(conn, settings, batch_id, owner, room)
    assert reply[0] not in (-1, -2), reply
    return parse_indices(reply[1].decode()) if reply[1] else []


def _ok(index: int) -> ExecResult:
    return ExecResult(True, f"{index}\n", "", 0, False, 0.01)


def test_an_index_is_counted_once_as_a_call_or_as_cancelled(redis_url: str) -> None:
    conn = redis.Redis.from_url(redis_url)
    settings = _settings(redis_url)
    keys = settings.keys
    batch_id = _store(conn, settings, 6, run="once")
    # 0 and 1 have results; 2, 3 and 0 (again) are cancelled: 0 keeps its result.
    assert _write_many(conn, settings, batch_id, [(0, _ok(0)), (1, _ok(1))], run="once") == [1, 1]
    assert cancel(conn, settings, batch_id, [0, 2, 3], run="once") == 2
    assert cancel(conn, settings, batch_id, [2, 3], run="once") == 0  # once only
    # A run's result that comes after its cancellation is neither written nor counted.
    assert _write_many(conn, settings, batch_id, [(2, _ok(2)), (4, _ok(4))], run="once") == [0, 1]
    # The whole batch: what is left without a result (5) is cancelled.
    assert cancel(conn, settings, batch_id, run="once") == 1
    got = counters.parse(conn.hgetall(keys.run_stats("once")))
    assert (got["calls"], got["ok"], got["cancelled"]) == (3, 3, 3)
    assert counters.parse(conn.hgetall(keys.stats()))["cancelled"] == 3
    stored = {
        int(k): codec.decode_result(v)
        for k, v in conn.hgetall(keys.batch_results(batch_id)).items()
    }
    assert {i: r.status for i, r in stored.items()} == {
        0: "ok",
        1: "ok",
        2: "cancelled",
        3: "cancelled",
        4: "ok",
        5: "cancelled",
    }
    # The done list holds every index once: results and cancellations alike.
    entries = [codec.decode_done_entry(e) for e in conn.lrange(keys.batch_done(batch_id), 0, -1)]
    assert sorted(i for i, _ in entries) == list(range(6))
    assert {i for i, r in entries if r.status == "cancelled"} == {2, 3, 5}
    assert 0 < conn.ttl(keys.batch_done(batch_id)) <= settings.batch_ttl_s
    assert cancel(conn, settings, new_batch_id(), run="once") == -1  # no such batch


def test_done_entries_encode_large_indices(redis_url: str) -> None:
    conn = redis.Redis.from_url(redis_url)
    settings = _settings(redis_url)
    batch_id = _store(conn, settings, 70_000)
    picked = [0, 127, 128, 255, 256, 65_535, 65_536, 69_999]
    assert cancel(conn, settings, batch_id, picked, run="r") == len(picked)
    done = conn.lrange(settings.keys.batch_done(batch_id), 0, -1)
    assert [codec.decode_done_entry(e)[0] for e in done] == picked


def test_cancelled_indices_are_never_claimed(redis_url: str) -> None:
    conn = redis.Redis.from_url(redis_url)
    settings = _settings(redis_url)
    _beat(conn, settings, "a")
    batch_id = _store(conn, settings, 10)
    cancel(conn, settings, batch_id, [1, 2, 8], run="r")
    first = _claim(conn, settings, batch_id, "a", room=4)
    assert 1 not in first and 2 not in first and 8 not in first
    rest: list[int] = []
    while claimed := _claim(conn, settings, batch_id, "a", room=4):
        rest += claimed
    assert sorted(first + rest) == [0, 3, 4, 5, 6, 7, 9]
    # The claims' records hold what is to run only: a lapse releases nothing cancelled.
    conn.zadd(settings.keys.leases(), {"a": 1.0})
    keys = settings.keys
    reply = release_script(
        conn,
        [
            keys.batch_state(batch_id),
            keys.batch_retry(batch_id),
            keys.batch_results(batch_id),
            keys.batch_done(batch_id),
            keys.open_batches(),
        ],
        ["a", "0", settings.batch_ttl_s, batch_id],
    )
    assert reply[0] == 7
    # Cancelled while released: not claimed again.
    _beat(conn, settings, "b")
    cancel(conn, settings, batch_id, [0, 3], run="r")
    again: list[int] = []
    while claimed := _claim(conn, settings, batch_id, "b", room=64):
        again += claimed
    assert sorted(again) == [4, 5, 6, 7, 9]


def test_a_cancelled_batch_has_nothing_to_claim(redis_url: str) -> None:
    conn = redis.Redis.from_url(redis_url)
    settings = _settings(redis_url)
    _beat(conn, settings, "a")
    batch_id = _store(conn, settings, 100)
    assert _claim(conn, settings, batch_id, "a", room=4)
    assert cancel(conn, settings, batch_id, run="r") == 100
    assert _claim(conn, settings, batch_id, "a", room=4) == []
    state = conn.hmget(settings.keys.batch_state(batch_id), "next", "retry", "cancelled")
    assert state == [b"100", b"0", b"100"]
    assert conn.zscore(settings.keys.open_batches(), batch_id) is None  # nobody joins it


def test_dispatchers_holding_claims_hear_of_it(redis_url: str) -> None:
    conn = redis.Redis.from_url(redis_url)
    settings = _settings(redis_url)
    keys = settings.keys
    for owner in ("a", "b", "c"):
        _beat(conn, settings, owner, host=owner)
    batch_id = _store(conn, settings, 30)
    _claim(conn, settings, batch_id, "a", room=4)
    _claim(conn, settings, batch_id, "b", room=4)
    listener = conn.pubsub()
    listener.subscribe(keys.cancel_channel("a"), keys.cancel_channel("b"), keys.cancel_channel("c"))
    heard: list[tuple[bytes, bytes]] = []

    def take() -> bool:
        message = listener.get_message(timeout=0.1)
        if message is not None and message["type"] == "message":
            heard.append((message["channel"], message["data"]))
        return len(heard) >= 4

    wait_until(lambda: listener.get_message(timeout=0.1) is None, what="the subscriptions")
    cancel(conn, settings, batch_id, [3, 29], run="r")
    cancel(conn, settings, batch_id, run="r")
    wait_until(take, what="four messages")
    a, b = keys.cancel_channel("a").encode(), keys.cancel_channel("b").encode()
    some, whole = f"{batch_id}|3,29".encode(), f"{batch_id}|all".encode()
    assert sorted(heard) == [(a, some), (a, whole), (b, some), (b, whole)]  # not c
    assert parse_message(f"{batch_id}|3,29") == (batch_id, frozenset({3, 29}))
    assert parse_message(f"{batch_id}|all") == (batch_id, None)
    assert parse_message("junk") is None
    listener.close()


def test_a_lapsed_producers_batches_are_cancelled_once(redis_url: str) -> None:
    conn = redis.Redis.from_url(redis_url)
    settings = _settings(redis_url)
    keys = settings.keys
    mine = [_store(conn, settings, 3, run="p", producer="prod-1") for _ in range(2)]
    other = _store(conn, settings, 3, run="p", producer="prod-2")
    # A producer that is through with its batches is forgotten (nothing to cancel).
    assert (
        producer_beat_script(
            conn, [keys.producers(), keys.producer_batches("prod-2")], ["prod-2", 60, other]
        )
        == 0
    )
    assert conn.zscore(keys.producers(), "prod-2") is None
    # prod-1 lapses: the next heartbeat names it, and a janitor cancels its batches.
    conn.zadd(keys.producers(), {"prod-1": 1.0})
    beat = host_beat(conn, keys, host="", lease_s=5.0, janitor=True)
    assert beat.lapsed_producers == ["prod-1"]
    janitor = Janitor(conn, settings, name="janitor")
    assert janitor.abandon([b"prod-1"]) == 6  # type: ignore[list-item]
    assert janitor.abandon([b"prod-1"]) == 0  # type: ignore[list-item]
    for batch_id in mine:
        stored = conn.hvals(keys.batch_results(batch_id))
        assert [codec.decode_result(v).status for v in stored] == ["cancelled"] * 3
    assert not conn.exists(keys.batch_results(other))
    assert counters.parse(conn.hgetall(keys.run_stats("p")))["cancelled"] == 6
    # A producer that beats is not lapsed: nothing is taken.
    _store(conn, settings, 1, producer="prod-3")
    assert (
        abandon_script(conn, [keys.producers(), keys.producer_batches("prod-3")], ["prod-3", 5.0])
        == []
    )
