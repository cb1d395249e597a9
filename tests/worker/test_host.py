"""The worker host keeps codepool:hosts tidy: its dispatchers' heartbeats put it there,
it forgets hosts silent for an hour (killed, never back), and takes itself out when it
stops cleanly."""

from __future__ import annotations

import redis

from codepool.common.keys import Keys
from tests.conftest import StartWorker, wait_until


def test_the_host_list_holds_live_hosts_only(redis_url: str, start_worker: StartWorker) -> None:
    """A host's entry is its lease: renewed while it lives, given up when it stops,
    and a lapsed one is fenced by a janitor (the live host's)."""
    client = redis.Redis.from_url(redis_url)
    keys = Keys()
    now = float(client.time()[0])
    client.zadd(keys.hosts(), {"gone-for-hours": now - 7200, "gone-a-minute": now - 60})
    client.sadd(keys.host_owners("gone-a-minute"), "gone-a-minute.0.x")
    client.zadd(keys.leases(), {"gone-a-minute.0.x": now - 60})
    worker = start_worker(name="tidy")

    def lease() -> bytes | None:
        return client.get(keys.host_start("tidy"))  # tidy~{its start's token}

    wait_until(lambda: lease() is not None, what="its own entry")
    assert lease().startswith(b"tidy~")
    tidy = lease()
    wait_until(
        lambda: client.zcard(keys.hosts()) == 1 and client.zcard(keys.fenced()) == 0,
        timeout_s=30,
        what="the lapsed hosts fenced and forgotten",
    )
    assert client.zscore(keys.leases(), "gone-a-minute.0.x") is None
    assert not client.exists(keys.host_owners("gone-a-minute"))
    assert client.zcard(keys.leases()) > 0  # tidy's own dispatchers, registered
    assert int(client.hget(keys.fleet(), "slots") or 0) == 2  # start_worker's -c 2
    assert worker.stop() == 0
    assert client.zscore(keys.hosts(), tidy) is None
    assert client.zcard(keys.leases()) == 0 and not client.exists(keys.host_owners(tidy.decode()))
    assert int(client.hget(keys.fleet(), "slots") or 0) == 0
    client.close()
