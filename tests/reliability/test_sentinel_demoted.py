"""A primary that stops being one under the producers (docs/chaos.md, finding 6): a
restarted primary comes back as a primary, takes writes, and is then demoted; before,
a submit then raised "cannot enqueue batch ...: The previous master is now a slave"
(redis-py's word for READONLY; its three quick retries were spent in 0.35 s) and a lone
call raised the same. Now a send asks the sentinels again and follows the primary,
within its budget. Here the primary is made a replica by hand for DEMOTED_S, the
sentinels still naming it: what Sentinel's demotion looks like to a client."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import redis

from codepool.producer import CodePool, RemoteSandbox
from tests.conftest import StartWorker, wait_for_dispatchers
from tests.sentinel import Sentinels, sentinel_mode_error

DEMOTED_S = 2.0


@pytest.fixture
def sentinels() -> Iterator[Sentinels]:
    why = sentinel_mode_error()
    if why is not None:
        pytest.skip(why)
    with Sentinels() as cluster:
        yield cluster


def _demote_for_a_while(port: int) -> threading.Thread:
    """The primary on ``port`` a replica (of nothing that answers) for DEMOTED_S."""
    primary = redis.Redis(port=port, socket_timeout=5)
    primary.execute_command("REPLICAOF", "127.0.0.1", "1")
    with pytest.raises(redis.exceptions.ReadOnlyError):
        primary.set("codepool-test:probe", "1")

    def restore() -> None:
        time.sleep(DEMOTED_S)
        primary.execute_command("REPLICAOF", "NO", "ONE")
        primary.close()

    thread = threading.Thread(target=restore, daemon=True)
    thread.start()
    return thread


def test_a_submit_and_a_lone_call_follow_a_demoted_primary(
    sentinels: Sentinels, start_worker: StartWorker
) -> None:
    worker = start_worker(url=sentinels.url, wait=False)
    wait_for_dispatchers(f"redis://127.0.0.1:{sentinels.primary_port()}/0", worker.name, worker)
    pool = CodePool(sentinels.url)
    try:
        assert pool.submit(["print(1)"]).results(timeout_s=60)[0].ok  # all warm
        port = sentinels.primary_port()
        restored = _demote_for_a_while(port)
        started = time.monotonic()
        batch = pool.submit(["print(2)"])  # raised RedisUnavailable before
        took_s = time.monotonic() - started
        restored.join()
        assert DEMOTED_S / 2 < took_s < DEMOTED_S + 10, took_s
        assert batch.results(timeout_s=60)[0].stdout == "2\n"
    finally:
        pool.close()
    with RemoteSandbox(sentinels.url, timeout=30.0) as sandbox:
        assert sandbox.run_code("print(3)").stdout == "3\n"  # all warm
        restored = _demote_for_a_while(sentinels.primary_port())
        result = sandbox.run_code("print(4)")  # raised a ConnectionError before
        restored.join()
        assert result.stdout == "4\n", result
