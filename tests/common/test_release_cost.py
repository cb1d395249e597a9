"""What ``ledger.RELEASE`` costs Redis: it reads the owner's claims, not the whole state
hash (whose spec field holds the batch, up to max_batch_bytes), and releases exactly
them when the hash is large enough to be scanned in pages."""

from __future__ import annotations

import socket
from typing import Any

import redis

from codepool.common.janitor import Janitor
from codepool.common.limits import Limits
from codepool.common.settings import Settings
from codepool.producer import CodePool
from codepool.producer.batch import Batch
from tests.common.test_ledger import _beat, _claim, _settings, _store


def _monitor(conn: redis.Redis) -> socket.socket:
    kwargs = conn.connection_pool.connection_kwargs
    mon = socket.create_connection((kwargs["host"], kwargs["port"]), timeout=10)
    mon.sendall(b"MONITOR\r\n")
    assert mon.recv(5) == b"+OK\r\n"
    return mon


def _seen_until(mon: socket.socket, marker: bytes) -> bytes:
    seen = b""
    while marker not in seen:
        chunk = mon.recv(1 << 16)
        assert chunk, "MONITOR closed"
        seen += chunk
    return seen


def test_a_release_reads_only_its_owners_claims(redis_url: str) -> None:
    # Failed before the fix: RELEASE ran HGETALL on the state hash, copying the batch's
    # spec (up to 256 MiB) into Lua once per owner and batch.
    conn = redis.Redis.from_url(redis_url)
    settings = _settings(redis_url)
    _beat(conn, settings, "a")
    _beat(conn, settings, "b")
    batch_id = _store(conn, settings, 3000)
    mine: list[int] = []
    theirs: list[int] = []
    for _ in range(600):  # a claim field each: the hash is scanned in several pages
        mine += _claim(conn, settings, batch_id, "a", room=1, most=1) or []
        theirs += _claim(conn, settings, batch_id, "b", room=1, most=1) or []
    assert len(mine) == len(theirs) == 600
    mon = _monitor(conn)
    try:
        released = Janitor(conn, settings, name="j").release(batch_id, "a", 1, graceful=False)
        conn.echo("release-done")
        seen = _seen_until(mon, b'"release-done"')
    finally:
        mon.close()
    assert b'"HGETALL"' not in seen and b'"spec"' not in seen
    assert b'"HSCAN"' in seen  # MONITOR shows what scripts run
    assert released == 600
    retry = [int(i) for i in conn.lrange(settings.keys.batch_retry(batch_id), 0, -1)]
    assert sorted(retry) == sorted(mine)  # each once
    owners = [
        value.split(b"|")[0]
        for field, value in conn.hgetall(settings.keys.batch_state(batch_id)).items()
        if field.startswith(b"c:")
    ]
    assert owners == [b"b"] * 600  # the other owner's claims are untouched
    conn.close()


def test_a_batchs_spec_is_kept_apart_from_its_state(redis_url: str, start_worker: Any) -> None:
    # The state hash that releases and cancellations scan holds no spec: on Redis 7.0 an
    # HSCAN copies every value it passes, matched or not.
    start_worker()
    pool = CodePool(redis_url)
    conn = redis.Redis.from_url(redis_url)
    keys = pool.keys
    batch = pool.submit([f"print({i})" for i in range(3)])
    assert conn.hget(keys.batch_state(batch.id), "spec") is None
    assert conn.get(keys.batch_spec(batch.id)) == batch.spec
    assert 0 < conn.ttl(keys.batch_spec(batch.id)) <= pool.settings.batch_ttl_s
    assert [r.stdout for r in batch.results(timeout_s=60)] == ["0\n", "1\n", "2\n"]
    # A batch stored the old way (spec in the state) is still run.
    old = _store(conn, Settings(redis_url=redis_url), 2)
    assert conn.hget(keys.batch_state(old), "spec") is not None
    assert pool.nudge(old, 2)  # announced
    assert [r.status for r in Batch(pool, old, 2, Limits()).results(timeout_s=60)] == ["ok"] * 2
    conn.close()
    pool.close()
