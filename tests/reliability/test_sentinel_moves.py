"""After a Sentinel failover, what waits on Redis moves to the new primary at once: a
fresh lone call answers within LONE_CALL_S of the election (before: 8.9-9.4 s, the
hosts' queue-waiting dispatchers and context servers reconnected to the *old* primary,
redis-py reconnecting inside ``send_packed_command`` to the address it had without
asking Sentinel, and sat there until Sentinel demoted it). A worker on a Sentinel URL
stops as fast as on a plain one (before: the whole drain deadline)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator

import pytest
import redis

from codepool.producer import CodePool
from tests.conftest import StartWorker, wait_for_dispatchers, wait_until
from tests.sentinel import SERVICE, Sentinels, sentinel_mode_error

LONE_CALL_S = 3.0  # the target for a fresh lone call after a failover
# A worker with nothing to do stops in well under a second on a plain URL; the drain
# deadline (10 s) is what the Sentinel one took.
IDLE_STOP_S = 5.0
IDLE_WINDOW_S = 5.0
BLOCKING = ("blmove", "blpop", "blmpop", "brpoplpush")
# A host waits on the queue (RQ's BLMOVE) and on its context requests (BLPOP).
HOSTS_READS = {"blmove", "blpop"}


@pytest.fixture
def sentinels() -> Iterator[Sentinels]:
    why = sentinel_mode_error()
    if why is not None:
        pytest.skip(why)
    with Sentinels() as cluster:
        yield cluster


def test_a_lone_call_after_a_failover_answers_at_once(
    sentinels: Sentinels, start_worker: StartWorker
) -> None:
    old = sentinels.primary_port()
    worker = start_worker(url=sentinels.url, wait=False)
    wait_for_dispatchers(f"redis://127.0.0.1:{old}/0", worker.name, worker)
    pool = CodePool(sentinels.url)
    assert pool.submit(["print(1)"]).results(timeout_s=60)[0].ok  # all warm
    assert HOSTS_READS <= _waiting_on(old)
    sentinels.sentinel(1).execute_command("SENTINEL", "FAILOVER", SERVICE)
    new = sentinels.wait_new_primary(old)
    elected = time.monotonic()
    # The host's blocking reads leave the old primary for the new one.
    wait_until(
        lambda: HOSTS_READS <= _waiting_on(new) and not HOSTS_READS & _waiting_on(old),
        timeout_s=LONE_CALL_S,
        what=lambda: f"old {_waiting_on(old)}, new {_waiting_on(new)}",
    )
    result = pool.submit(["print(2)"]).results(timeout_s=60)[0]
    took_s = time.monotonic() - elected
    print(f"lone call answered {took_s:.2f} s after the election", file=sys.stderr)
    assert result.ok and result.stdout == "2\n", result
    assert took_s < LONE_CALL_S, (took_s, worker.log()[-3000:])
    pool.close()


def _waiting_on(port: int) -> set[str]:
    """The blocking reads waiting on the server at ``port``."""
    client = redis.Redis(port=port, socket_timeout=2)
    try:
        return {c["cmd"] for c in client.client_list() if c["cmd"] in BLOCKING}
    except redis.RedisError:
        return set()
    finally:
        client.close()


def test_a_worker_on_a_sentinel_url_stops_at_once(
    sentinels: Sentinels, start_worker: StartWorker
) -> None:
    worker = start_worker(url=sentinels.url, wait=False)
    wait_for_dispatchers(f"redis://127.0.0.1:{sentinels.primary_port()}/0", worker.name, worker)
    asked = time.monotonic()
    assert worker.stop() == 0
    took_s = time.monotonic() - asked
    print(f"stopped in {took_s:.2f} s", file=sys.stderr)
    assert took_s < IDLE_STOP_S, worker.log()[-3000:]


def _sentinel_rate(cluster: Sentinels) -> float:
    """Commands a second the cluster's sentinels serve, over IDLE_WINDOW_S (Sentinel
    keeps no per-command counts; the sentinels' own traffic is in it too)."""

    def served() -> int:
        total = 0
        for number in range(3):
            client = cluster.sentinel(number)
            try:
                total += int(client.info("stats")["total_commands_processed"])
            finally:
                client.close()
        return total

    before, started = served(), time.monotonic()
    time.sleep(IDLE_WINDOW_S)  # a measuring window, not a wait for something
    return (served() - before) / (time.monotonic() - started)


def test_an_idle_host_asks_the_sentinels_once_a_second(
    sentinels: Sentinels, start_worker: StartWorker
) -> None:
    """One watcher per host, whatever its dispatchers (before: one per Redis client of
    each of its processes: -k 4 made eight requests a second)."""
    baseline = _sentinel_rate(sentinels)
    worker = start_worker("-k", "4", url=sentinels.url, wait=False)
    wait_for_dispatchers(f"redis://127.0.0.1:{sentinels.primary_port()}/0", worker.name, worker)
    added = _sentinel_rate(sentinels) - baseline
    print(f"{added:.1f} sentinel requests a second from an idle host", file=sys.stderr)
    # The host's one watcher asks once a second; the margin is the sentinels' own
    # traffic, which varies a little between the two windows.
    assert added < 3.0, added
