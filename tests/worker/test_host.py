"""The worker host keeps codepool:hosts tidy: its dispatchers' heartbeats put it there,
it forgets hosts silent for an hour (killed, never back), and takes itself out when it
stops cleanly."""

from __future__ import annotations

import time

import redis

from codepool.common.keys import Keys
from tests.conftest import StartWorker, wait_until


def test_the_host_list_holds_live_hosts_only(redis_url: str, start_worker: StartWorker) -> None:
    client = redis.Redis.from_url(redis_url)
    hosts = Keys().hosts()
    client.zadd(hosts, {"gone-for-hours": time.time() - 7200, "gone-a-minute": time.time() - 60})
    worker = start_worker(name="tidy")
    wait_until(lambda: client.zscore(hosts, "tidy") is not None, what="the host's own entry")
    wait_until(lambda: client.zscore(hosts, "gone-for-hours") is None, what="the stale host gone")
    assert client.zscore(hosts, "gone-a-minute") is not None
    assert worker.stop() == 0
    assert client.zscore(hosts, "tidy") is None
    client.close()
