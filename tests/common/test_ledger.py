"""The batch ledger's scripts against a real redis-server: claims spread a batch, a lapsed
dispatcher's unfinished work is released (once), and results are counted once, with
their first write."""

from __future__ import annotations

from collections import Counter
from typing import Any

import redis

from codepool.common import codec, counters
from codepool.common.janitor import Janitor
from codepool.common.ledger import (
    HostBeat,
    claim_script,
    host_beat,
    leave_script,
    parse_indices,
    submit_script,
    write_script,
)
from codepool.common.limits import Limits
from codepool.common.queueing import announcements_for
from codepool.common.result import ExecResult
from codepool.common.settings import Settings
from codepool.common.tally import count_hashes, write_calls
from codepool.common.wire import BatchJob, new_batch_id


def _settings(url: str) -> Settings:
    return Settings(redis_url=url, lease_s=5.0)


def _store(
    conn: redis.Redis,
    settings: Settings,
    n: int,
    reruns: int = 2,
    *,
    run: str = "r",
    producer: str = "",
) -> str:
    """A batch of ``n`` snippets, stored as ``ledger.SUBMIT`` stores it (under
    ``producer``'s lease when one is named); returns its id."""
    batch_id = new_batch_id()
    spec = BatchJob.from_codes(batch_id, ["print(1)"] * n, Limits(), run, 0.0).encode()
    keys = settings.keys
    submit_script(
        conn,
        [
            keys.batch_state(batch_id),
            keys.hosts(),
            keys.open_batches(),
            keys.producers(),
            keys.producer_batches(producer),
        ],
        [spec, n, run, reruns, settings.batch_ttl_s, settings.lease_s, batch_id, producer],
    )
    return batch_id


def _claim_reply(
    conn: redis.Redis, settings: Settings, batch_id: str, owner: str, room: int, most: int = 64
) -> list[Any]:
    """``ledger.CLAIM``'s reply, given the results hash (so cancelled indices are left out)."""
    keys = settings.keys
    return claim_script(
        conn,
        [
            keys.batch_state(batch_id),
            keys.batch_retry(batch_id),
            keys.leases(),
            keys.owner_batches(owner),
            keys.open_batches(),
            keys.batch_results(batch_id),
        ],
        [owner, batch_id, room, most, settings.lease_s, "1", 1],
    )


def _claim(
    conn: redis.Redis, settings: Settings, batch_id: str, owner: str, room: int, most: int = 64
) -> list[int] | None:
    reply = _claim_reply(conn, settings, batch_id, owner, room, most)
    if reply[0] == -2:
        return None
    if reply[0] == -1:  # no such batch
        return []
    return parse_indices(reply[1].decode()) if reply[1] else []


def _beat(conn: redis.Redis, settings: Settings, owner: str, host: str | None = None) -> HostBeat:
    """A beat of worker host ``host`` (default ``{owner}-h``) with its dispatcher
    ``owner`` (registered the first time), and the janitor's round."""
    host = host or f"{owner}-h"
    keys = settings.keys
    return host_beat(
        conn,
        keys,
        host=host,
        lease_s=settings.lease_s,
        first=conn.zscore(keys.hosts(), host) is None,
        new=[] if conn.zscore(keys.leases(), owner) is not None else [owner],
        janitor=True,
    )


def _write_many(
    conn: redis.Redis,
    settings: Settings,
    batch_id: str,
    results: list[tuple[int, ExecResult]],
    *,
    worker: str = "w1",
    run: str = "r",
) -> list[int]:
    firsts: list[int] = []
    for call_keys, args in write_calls(
        settings.keys,
        batch_id,
        results,
        worker=worker,
        run=run,
        batch_ttl_s=settings.batch_ttl_s,
        minute_ttl_s=60,
    ):
        firsts += write_script(conn, call_keys, args)
    return firsts


def _write(conn: redis.Redis, settings: Settings, batch_id: str, index: int) -> int:
    result = ExecResult(True, f"{index}\n", "", 0, False, 0.01)
    return _write_many(conn, settings, batch_id, [(index, result)])[0]


def test_claims_cover_every_index_once_and_shrink_as_the_batch_drains(redis_url: str) -> None:
    conn = redis.Redis.from_url(redis_url)
    settings = _settings(redis_url)
    for owner in ("a", "b", "c"):
        _beat(conn, settings, owner, host=owner)
    batch_id = _store(conn, settings, 100)
    sizes, seen = [], []
    while True:
        got = _claim(conn, settings, batch_id, "abc"[len(sizes) % 3], room=1)
        assert got is not None
        if not got:
            break
        sizes.append(len(got))
        seen += got
    assert sorted(seen) == list(range(100))
    assert sizes[0] == 20 and sizes[-1] == 1  # ceil(100 / (1 + 2 * 2 others)), down to one
    assert sizes == sorted(sizes, reverse=True)
    # A dispatcher without a lease claims nothing.
    assert _claim(conn, settings, _store(conn, settings, 3), "stranger", 1) is None


def test_a_lapsed_dispatchers_unfinished_work_is_released_once(redis_url: str) -> None:
    conn = redis.Redis.from_url(redis_url)
    settings = _settings(redis_url)
    _beat(conn, settings, "dead")
    _beat(conn, settings, "alive")
    batch_id = _store(conn, settings, 10)
    claimed = _claim(conn, settings, batch_id, "dead", room=10)
    assert claimed == list(range(10))
    for index in (0, 1, 2):
        assert _write(conn, settings, batch_id, index) == 1
    # Lapse "dead"'s host: its last beat is older than the lease.
    conn.zadd(settings.keys.hosts(), {"dead-h": 1.0})
    assert _beat(conn, settings, "alive").lapsed == ["dead-h"]
    janitor = Janitor(conn, settings, name="alive")
    assert janitor.sweep(["dead-h"], live=1) == 7
    assert janitor.sweep(["dead-h"], live=1) == 0
    # Released indices are claimed before anything else, by a live dispatcher.
    again = _claim(conn, settings, batch_id, "alive", room=10)
    assert again == [3, 4, 5, 6, 7, 8, 9]
    # The fenced host learns it at its next beat (which does not bring it back), and
    # its dispatcher may claim nothing.
    beat = host_beat(conn, settings.keys, host="dead-h", lease_s=5.0)
    assert beat.lost and beat.live is None
    assert conn.zscore(settings.keys.hosts(), "dead-h") is None
    assert conn.zscore(settings.keys.leases(), "dead") is None
    assert _claim(conn, settings, batch_id, "dead", 1) is None
    # The three it finished were counted as they were written, and only then.
    assert counters.parse(conn.hgetall(settings.keys.stats()))["calls"] == 3
    # A late write for an index already written is dropped.
    assert _write(conn, settings, batch_id, 0) == 0
    assert conn.llen(settings.keys.batch_done(batch_id)) == 3


def test_a_snippet_lost_too_often_comes_back_infra(redis_url: str) -> None:
    conn = redis.Redis.from_url(redis_url)
    settings = _settings(redis_url)
    batch_id = _store(conn, settings, 1, reruns=1)
    for attempt in range(2):
        owner = f"host{attempt}"
        _beat(conn, settings, owner)
        assert _claim(conn, settings, batch_id, owner, 1) == [0]
        conn.zadd(settings.keys.hosts(), {f"{owner}-h": 1.0})
        Janitor(conn, settings, name="j").sweep([f"{owner}-h"], live=1)
    entries = conn.lrange(settings.keys.batch_done(batch_id), 0, -1)
    assert len(entries) == 1
    index, result = codec.decode_done_entry(entries[0])
    assert index == 0 and result.status == "infra" and "lost 2 times" in result.stderr
    assert counters.parse(conn.hgetall(settings.keys.stats()))["infra"] == 1


def test_the_write_counts_what_python_counts_once_per_index_however_often_written(
    redis_url: str,
) -> None:
    conn = redis.Redis.from_url(redis_url)
    settings = _settings(redis_url)
    results = [
        (i, ExecResult(i % 3 == 0, "", "", 0, False, 0.001 * 7**i, status=s, exec_s=0.002 * i))
        for i, s in enumerate(["ok", "error", "timeout", "ok", "memory", "ok"])
    ]
    results[5] = (5, results[5][1].replace(zygote="bare"))
    results[2] = (2, results[2][1].replace(limit="wall_time"))
    results[4] = (4, results[4][1].replace(limit="memory", zygote="light"))
    expected: Counter[str] = Counter()
    for _, result in results:
        expected.update(counters.count(result))
    assert _write_many(conn, settings, "b1", results[:4], run="run1") == [1, 1, 1, 1]
    # A retried write of the same results, plus new ones, counts only the new ones; so
    # does the first of another batch.
    assert _write_many(conn, settings, "b1", results, run="run1") == [0, 0, 0, 0, 1, 1]
    assert _write_many(conn, settings, "b2", results[:1], run="run1") == [1]
    expected.update(counters.count(results[0][1]))
    hashes = count_hashes(settings.keys, "w1", "run1")
    for key in hashes:
        got = counters.parse(conn.hgetall(key))
        assert got == {field: value for field, value in expected.items() if value}, key
    assert 0 < conn.ttl(hashes[1]) <= 60  # the minute hash expires
    assert got["zygote_bare"] == 1
    # The first write of index 2 and of 4, counted once each however often written.
    limits = {f: got[f] for f in counters.LIMIT_FIELDS if f in got}
    assert limits == {"limit_wall_time": 1, "limit_memory": 1}


def test_a_large_write_is_split_into_calls_and_counted_whole(redis_url: str) -> None:
    conn = redis.Redis.from_url(redis_url)
    settings = _settings(redis_url)
    result = ExecResult(True, "", "", 0, False, 0.01)
    firsts = _write_many(conn, settings, "big", [(i, result) for i in range(1234)], run="")
    assert firsts == [1] * 1234
    assert counters.parse(conn.hgetall(settings.keys.stats()))["calls"] == 1234
    assert conn.llen(settings.keys.batch_done("big")) == 1234


def test_one_write_call_takes_many_results_and_the_first_write_of_each_wins(
    redis_url: str,
) -> None:
    conn = redis.Redis.from_url(redis_url)
    settings = _settings(redis_url)
    batch_id = new_batch_id()
    keys = [settings.keys.batch_results(batch_id), settings.keys.batch_done(batch_id)]

    def write(indices: list[int], text: str) -> list[int]:
        result = ExecResult(True, text, "", 0, False, 0.01)
        return _write_many(conn, settings, batch_id, [(i, result) for i in indices])

    assert write([0, 1, 2], "first") == [1, 1, 1]
    assert write([2, 3], "second") == [0, 1]
    done = [codec.decode_done_entry(e) for e in conn.lrange(keys[1], 0, -1)]
    assert [(i, r.stdout) for i, r in done] == [
        (0, "first"),
        (1, "first"),
        (2, "first"),
        (3, "second"),
    ]
    assert codec.decode_result(conn.hget(keys[0], "2")).stdout == "first"
    # Every write (re)sets the TTL of what it leaves, a done list the producer drained and
    # a later push made anew included; a write of duplicates only pushes nothing.
    ttl_s = settings.batch_ttl_s
    assert 0 < conn.ttl(keys[0]) <= ttl_s and 0 < conn.ttl(keys[1]) <= ttl_s
    conn.delete(keys[1])
    assert write([3], "again") == [0]
    assert not conn.exists(keys[1])
    assert write([4], "third") == [1]
    assert 0 < conn.ttl(keys[1]) <= ttl_s


def test_batches_see_live_hosts_and_a_claim_says_when_it_was_the_last(redis_url: str) -> None:
    conn = redis.Redis.from_url(redis_url)
    settings = _settings(redis_url)
    keys = settings.keys
    # Two dispatchers of host h1 and one of h2: two live hosts, for a heartbeat and a
    # submit alike; a host whose dispatchers fell silent is not live any more.
    _beat(conn, settings, "h1.0.x", host="h1")
    _beat(conn, settings, "h1.1.y", host="h1")
    assert _beat(conn, settings, "h2.0.z", host="h2").live == 2
    assert host_beat(conn, keys, host="", lease_s=5.0, janitor=True).live == 2
    batch_id = new_batch_id()
    spec = BatchJob.from_codes(batch_id, ["print(1)"] * 5, Limits(), "", 0.0).encode()
    state = [keys.batch_state(batch_id), keys.hosts(), keys.open_batches()]
    assert submit_script(conn, state, [spec, 5, "", 2, 3600, 5.0, batch_id])[0] == 2
    conn.zadd(keys.hosts(), {"h2": 1.0})
    assert submit_script(conn, state, [spec, 5, "", 2, 3600, 5.0, batch_id])[0] == 1
    # A claim leaves a share for every live dispatcher of another host (h2's one: a
    # third of 9), and once that one is silent the lone host takes what is left in one
    # go (within room and MAX_CLAIM), told that it was the last: no claim round trip
    # follows to learn it.
    batch_id = _store(conn, settings, 9)
    claim_keys = [keys.batch_state(batch_id), keys.batch_retry(batch_id), keys.leases()]
    claim_keys += [keys.owner_batches("h1.0.x"), keys.open_batches()]
    first = claim_script(conn, claim_keys, ["h1.0.x", batch_id, 1, 64, 5.0, "1", 2])
    assert (first[1], first[3]) == (b"0-2", 0)
    conn.zrem(keys.leases(), "h2.0.z")  # fenced
    last = claim_script(conn, claim_keys, ["h1.0.x", batch_id, 1, 64, 5.0, "0", 2])
    assert (last[1], last[3]) == (b"3-8", 1)
    assert claim_script(conn, claim_keys, ["h1.0.x", batch_id, 1, 64, 5.0, "0", 2])[0] == 0


def test_a_batch_others_could_share_is_open_until_its_last_claim_and_again_when_released(
    redis_url: str,
) -> None:
    conn = redis.Redis.from_url(redis_url)
    settings = _settings(redis_url)
    keys = settings.keys

    def open_now() -> list[bytes]:
        return list(conn.zrange(keys.open_batches(), 0, -1))

    _beat(conn, settings, "a", host="a")
    pair = _store(conn, settings, 2)  # one host's work (MIN_SHARE): never open
    batch_id = _store(conn, settings, 10)
    assert open_now() == [batch_id.encode()]
    # A claim within max_k leaves the rest open; the one that takes the last index closes it.
    assert _claim(conn, settings, batch_id, "a", room=1, most=4) == [0, 1, 2, 3]
    assert open_now() == [batch_id.encode()]
    assert _claim(conn, settings, batch_id, "a", room=1) == list(range(4, 10))
    assert open_now() == []
    assert _claim(conn, settings, pair, "a", room=1) == [0, 1]
    # Work released from a lapsed claim opens it again, until it is claimed once more.
    for index in (0, 1):
        _write(conn, settings, pair, index)
    _write(conn, settings, batch_id, 0)
    conn.zadd(keys.hosts(), {"a": 1.0})
    _beat(conn, settings, "b", host="b")
    assert Janitor(conn, settings, name="b").sweep(["a"], live=1) == 9
    assert open_now() == [batch_id.encode()]
    assert sorted(_claim(conn, settings, batch_id, "b", room=9) or []) == list(range(1, 10))
    assert open_now() == []
    # A batch that is gone (expired) leaves the set at its first claim.
    gone = _store(conn, settings, 5)
    conn.delete(keys.batch_state(gone))
    assert _claim(conn, settings, gone, "b", room=1) == []
    assert open_now() == []


def test_the_fleet_counts_the_slots_of_its_hosts_and_batches_fan_out_by_them(
    redis_url: str,
) -> None:
    conn = redis.Redis.from_url(redis_url)
    settings = _settings(redis_url)
    keys = settings.keys

    def fleet_slots() -> int:
        return int(conn.hget(keys.fleet(), "slots") or 0)

    for host, slots in (("big", 64), ("small", 2)):
        host_beat(conn, keys, host=host, lease_s=5.0, first=True, slots=slots, new=[host + ".0"])
        # A second first beat (a failover's lost reply, say) registers nothing twice.
        host_beat(conn, keys, host=host, lease_s=5.0, first=True, slots=slots)
    assert fleet_slots() == 66
    conn.zadd(keys.hosts(), {"big": 1.0})  # lapsed
    assert Janitor(conn, settings, name="j").sweep(["big"], live=1) == 0
    assert fleet_slots() == 2 and conn.hget(keys.host_slots(), "big") is None
    state = [keys.batch_state("b"), keys.hosts(), keys.open_batches(), keys.producers()]
    state += [keys.producer_batches(""), keys.fleet()]
    assert submit_script(conn, state, [b"spec", 5, "", 2, 3600, 5.0, "b", ""]) == [1, 2]
    leave = [keys.hosts(), keys.host_owners("small"), keys.host_slots(), keys.fleet()]
    assert leave_script(conn, leave, ["small"]) == 1
    assert leave_script(conn, leave, ["small"]) == 0  # once
    assert fleet_slots() == 0 and conn.zcard(keys.hosts()) == 0
    # One invitation per two snippets, at most the live hosts, and at most twice the
    # hosts the batch needs at the fleet's mean host size.
    assert announcements_for(16, live_hosts=1000) == 8
    assert announcements_for(128, live_hosts=1000, fleet_slots=64_000) == 4
    assert announcements_for(16, live_hosts=10, fleet_slots=20) == 8
    assert announcements_for(1, live_hosts=0, fleet_slots=0) == 1
