"""Delivery that reconciles, and a collection that stops waiting: real redis-server,
real `codepool worker` processes, and a Redis proxy (tests/redis_proxy.py) between the
producer and Redis where a reply must be lost on the way.

A BLMPOP whose reply is lost (its connection dropped after Redis popped) loses what it
popped; the producer finds those results in the results hash instead of reporting them
``infra`` at its deadline. A collection that stops waiting (the caller's ``timeout_s``,
the backstop deadline, no live worker) cancels what it no longer waits for."""

from __future__ import annotations

import time

import redis
from rq import Queue

from codepool.common.codec import MsgpackSerializer
from codepool.common.result import ExecResult
from codepool.common.settings import Settings
from codepool.producer import CodePool
from codepool.producer.batch import DEADLINE_MESSAGE
from tests.conftest import KILLED_WITHIN_S, StartWorker, sleeping_below, sleeping_pids, wait_until
from tests.processes import still_running
from tests.producer.test_cancel import SLEEPER, counted
from tests.redis_proxy import RedisProxy


def _upstream(redis_url: str) -> tuple[str, int]:
    client = redis.Redis.from_url(redis_url)
    kwargs = client.connection_pool.connection_kwargs
    client.close()
    return str(kwargs["host"]), int(kwargs["port"])


def outcomes(results: list[ExecResult]) -> list[tuple[str, str]]:
    return [(r.status, r.stdout) for r in results]


def test_results_whose_pop_reply_was_lost_still_arrive(
    redis_url: str, start_worker: StartWorker
) -> None:
    # Failed before the fix: the popped results were gone; the batch came back infra
    # at its deadline, although every result sat in the results hash.
    start_worker(concurrency=2)
    with RedisProxy(_upstream(redis_url)) as proxy:
        pool = CodePool(proxy.url)
        lost = proxy.drop_reply("BLMPOP")
        batch = pool.submit([f"print({i})" for i in range(6)], deadline_s=20.0, run="lost")
        results = batch.results()
        assert lost.is_set(), "no BLMPOP reply was dropped"
        pool.close()
    assert outcomes(results) == [("ok", f"{i}\n") for i in range(6)]
    assert batch.duplicates == 0
    got = counted(redis_url, "lost")
    assert (got["calls"], got["ok"]) == (6, 6), got


def test_a_lost_reply_is_reconciled_on_every_read_that_follows(
    redis_url: str, start_worker: StartWorker
) -> None:
    # Two replies lost, one after the other, in one batch whose results come over time:
    # each is made good, and no index comes back twice.
    start_worker(concurrency=2)
    codes = [f"import time\ntime.sleep({0.3 * (i % 3)})\nprint({i})" for i in range(8)]
    with RedisProxy(_upstream(redis_url)) as proxy:
        pool = CodePool(proxy.url)
        first, second = proxy.drop_reply("BLMPOP"), proxy.drop_reply("BLMPOP", nth=2)
        batch = pool.submit(codes, deadline_s=30.0)
        seen = [index for index, _ in batch.as_completed()]
        assert first.is_set() and second.is_set()
        pool.close()
    assert sorted(seen) == list(range(8))
    assert outcomes(batch.results()) == [("ok", f"{i}\n") for i in range(8)]
    assert batch.duplicates == 0


def test_a_caller_that_stops_waiting_cancels_the_rest(
    redis_url: str, start_worker: StartWorker
) -> None:
    # Failed before the fix: results(timeout_s=) reported infra and the sleepers ran on
    # (for nobody) until their own timeout.
    worker = start_worker(concurrency=2)
    pool = CodePool(redis_url)
    batch = pool.submit([SLEEPER] * 4 + ["print('quick')"], timeout_s=300, run="stopped")
    wait_until(lambda: sleeping_below(worker.process.pid) == 2, what="two snippets running")
    running = sleeping_pids(worker.process.pid)
    results = batch.results(timeout_s=1.0)
    assert [r.status for r in results[:4]] == ["infra"] * 4, results
    assert results[0].stderr.startswith(DEADLINE_MESSAGE)
    wait_until(lambda: not still_running(running), KILLED_WITHIN_S, what="both sleepers killed")
    # What was not started never starts; the quick one may have run before the give-up.
    got = counted(redis_url, "stopped")
    assert got["cancelled"] + got.get("ok", 0) == 5 and got["cancelled"] >= 4, got
    assert results[4].status in ("ok", "infra")
    pool.close()


def test_a_batch_past_its_deadline_cancels_the_rest_and_keeps_what_arrived(
    redis_url: str, start_worker: StartWorker
) -> None:
    worker = start_worker(concurrency=2)
    pool = CodePool(redis_url)
    batch = pool.submit(["print('first')", SLEEPER, SLEEPER], timeout_s=300, deadline_s=3.0)
    wait_until(lambda: sleeping_below(worker.process.pid) == 2, what="two snippets running")
    running = sleeping_pids(worker.process.pid)
    results = batch.results()
    assert outcomes(results)[0] == ("ok", "first\n")
    assert [r.status for r in results[1:]] == ["infra", "infra"]
    wait_until(lambda: not still_running(running), KILLED_WITHIN_S, what="both sleepers killed")
    pool.close()


def test_no_live_worker_withdraws_the_batch(redis_url: str) -> None:
    # Failed before the fix: the announcement stayed queued, and a worker that started
    # later ran the batch for nobody.
    settings = Settings.from_env(redis_url=redis_url).replace(no_worker_wait_s=1.0)
    pool = CodePool(settings=settings)
    client = redis.Redis.from_url(redis_url)
    queue = Queue(settings.queue, connection=client, serializer=MsgpackSerializer)
    batch = pool.submit(["print(1)"] * 3, run="nobody")
    assert queue.job_ids
    started = time.monotonic()
    results = batch.results()
    assert time.monotonic() - started < 30.0
    assert {r.status for r in results} == {"infra"}
    assert "no live worker" in results[0].stderr
    assert queue.job_ids == []
    assert counted(redis_url, "nobody")["cancelled"] == 3
    client.close()
    pool.close()


def test_a_collection_keeps_its_deadline_while_redis_stops_answering(
    redis_url: str, start_worker: StartWorker
) -> None:
    # Failed before the fix (docs/chaos.md, finding 1): a read on a Redis that stopped
    # answering waited out the 30-s socket timeout in each of redis-py's retries, and in
    # the handshake's nested in them; results() was still blocked after 460 s against a
    # 4-s deadline. What is missing comes back infra within seconds of the deadline.
    start_worker(concurrency=2)
    with RedisProxy(_upstream(redis_url)) as proxy:
        pool = CodePool(proxy.url)
        batch = pool.submit([SLEEPER] * 3, deadline_s=4.0, run="stalled")
        wait_until(lambda: pool.watch() is not None, what="a first look at the fleet")
        time.sleep(1.0)
        proxy.stall()
        started = time.monotonic()
        results = batch.results()
        took = time.monotonic() - started
        proxy.resume()
        pool.close()
    assert [r.status for r in results] == ["infra"] * 3, results
    assert took < 3.0 + 25.0, f"results() took {took:.1f} s past a 4-s deadline"
