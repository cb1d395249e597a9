"""A Redis failover under Sentinel mid-batch: a primary, a replica and three sentinels of
the test's own, a real worker and a producer both given the Sentinel URL. Forced by
SENTINEL FAILOVER (the old primary keeps acking writes for seconds after the promotion:
they are lost) and by kill -9 of the primary. Every index comes back once with its
output, nothing is infra, the counters hold each snippet once, and the batch ends
within 20 s of the new primary's election."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import redis

from codepool.common import counters
from codepool.common.connection import redis_client
from codepool.common.settings import Settings
from codepool.ops.redis_checks import check_redis
from codepool.producer import CodePool
from tests.conftest import StartWorker, wait_for_dispatchers, wait_until
from tests.sentinel import SERVICE, Sentinels, sentinel_mode_error

N = 400
RESULT_COUNTER_KEY = Settings().keys.stats()
RECOVERY_S = 20.0


@pytest.fixture
def sentinels() -> Iterator[Sentinels]:
    why = sentinel_mode_error()
    if why is not None:
        pytest.skip(why)
    with Sentinels() as cluster:
        yield cluster


def _manual(cluster: Sentinels, old_port: int) -> None:
    cluster.sentinel(1).execute_command("SENTINEL", "FAILOVER", SERVICE)


def _kill(cluster: Sentinels, old_port: int) -> None:
    """kill -9 of the primary while its replica lags by some results: the replica
    sleeps (DEBUG SLEEP), the worker writes on, then the primary dies."""
    primary = redis.Redis(port=old_port)
    replica_port = next(s.port for s in cluster.servers if s.port != old_port)
    sleeper = threading.Thread(
        target=lambda: redis.Redis(port=replica_port).execute_command("DEBUG", "SLEEP", "1.5")
    )
    before = int(primary.hget(RESULT_COUNTER_KEY, "calls") or 0)
    sleeper.start()
    wait_until(
        lambda: int(primary.hget(RESULT_COUNTER_KEY, "calls") or 0) >= before + 10,
        what="results the replica lacks",
    )
    cluster.server_on(old_port).stop(kill=True)
    sleeper.join()
    primary.close()


@pytest.mark.parametrize("force", [_manual, _kill], ids=["sentinel-failover", "kill-9"])
def test_a_batch_rides_out_a_failover(
    sentinels: Sentinels, start_worker: StartWorker, force: Callable[[Sentinels, int], None]
) -> None:
    old = sentinels.primary_port()
    worker = start_worker(url=sentinels.url, wait=False)
    wait_for_dispatchers(f"redis://127.0.0.1:{old}/0", worker.name, worker)
    pool = CodePool(sentinels.url)
    codes = [f"import time\ntime.sleep(0.05)\nprint({i})" for i in range(N)]
    batch = pool.submit(codes)
    wait_until(lambda: pool.counters().get("calls", 0) >= N // 5, 60, "a fifth of the batch")
    force(sentinels, old)
    sentinels.wait_new_primary(old)
    elected = time.monotonic()
    results = batch.results(timeout_s=120)
    took_s = time.monotonic() - elected
    print(f"batch done {took_s:.1f} s after the election", file=sys.stderr)
    assert [r.status for r in results].count("ok") == N, {r.status for r in results}
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(N)]
    assert took_s <= RECOVERY_S
    # Each snippet counted once on the primary the sentinels name now: the results lost
    # with the old primary were written and counted again on the new one, those it had
    # were not counted twice.
    truth = redis_client(Settings(redis_url=sentinels.url))

    def counted() -> dict[str, int]:
        return counters.parse(truth.hgetall(RESULT_COUNTER_KEY))

    wait_until(lambda: counted().get("calls", 0) >= N, 10, "every snippet counted")
    assert worker.stop() == 0  # its writer has written all it holds
    assert counted()["calls"] == N
    assert counted()["ok"] == N
    truth.close()
    pool.close()


def test_doctor_says_the_primary_is_sentinel_managed(sentinels: Sentinels) -> None:
    lines = {line["name"]: line for line in check_redis(sentinels.url)}
    reachable = lines["redis reachable"]
    assert reachable["active"]
    assert f"Sentinel-managed primary {SERVICE!r} at 127.0.0.1:{sentinels.primary_port()}" in str(
        reachable["detail"]
    )
