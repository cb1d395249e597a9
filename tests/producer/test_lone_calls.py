"""Lone calls (producer/calls.py, worker/call_server.py): one snippet at a time on the
fleet's open work channel, no RQ job; real redis-server, real worker processes."""

from __future__ import annotations

import threading
import time
from typing import Any

import redis

from codepool.common.janitor import start_of
from codepool.common.keys import Keys
from codepool.common.limits import Limits
from codepool.common.lone_calls import INBOX_TTL_S, LoneCall
from codepool.producer import RemoteSandbox
from tests.conftest import (
    KILLED_WITHIN_S,
    StartWorker,
    sleeping_below,
    sleeping_pids,
    wait_until,
)
from tests.processes import still_running
from tests.reliability.test_worker_loss import _kill_host


def _commands(client: redis.Redis) -> dict[str, int]:
    stats: dict[str, Any] = client.info("commandstats")
    return {name: int(entry["calls"]) for name, entry in stats.items()}


def test_a_lone_call_costs_a_few_commands_and_no_rq_job(
    redis_url: str, start_worker: StartWorker
) -> None:
    start_worker(concurrency=2)
    client = redis.Redis.from_url(redis_url)
    with RemoteSandbox(redis_url, timeout=5.0) as sandbox:
        assert sandbox.run_code("print(2 + 3)").stdout == "5\n"  # the pool looked at the fleet
        jobs_before = len(client.keys("rq:job:*"))
        before = _commands(client)
        n = 100
        results = [sandbox.run_code(f"print({i} * 2)") for i in range(n)]
        after = _commands(client)
    assert [r.stdout for r in results] == [f"{i * 2}\n" for i in range(n)]
    spent = {name: after[name] - before.get(name, 0) for name in after}
    spent.pop("cmdstat_info", None)  # our own
    per_call = sum(spent.values()) / n
    # Before lone calls each one was a batch with its RQ job: about 99 commands.
    assert per_call <= 8, {name: count for name, count in spent.items() if count}
    assert len(client.keys("rq:job:*")) == jobs_before
    assert spent.get("cmdstat_blmove", 0) >= n  # taken off the call list by the host


def test_concurrent_lone_calls_each_get_their_own_result_once(
    redis_url: str, start_worker: StartWorker
) -> None:
    start_worker(concurrency=2)
    results: dict[tuple[int, int], str] = {}
    with RemoteSandbox(redis_url, timeout=10.0, run="agents") as sandbox:
        sandbox.run_code("pass")

        def agent(a: int) -> None:
            for turn in range(8):
                time.sleep(0.001 * (a % 4))  # think
                result = sandbox.run_code(f"print({a} * 1000 + {turn})")
                results[(a, turn)] = result.stdout

        threads = [threading.Thread(target=agent, args=(a,)) for a in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not any(thread.is_alive() for thread in threads)
        assert results == {(a, t): f"{a * 1000 + t}\n" for a in range(16) for t in range(8)}

        def counted() -> bool:
            return sandbox.pool.counters("agents").get("calls", 0) >= 129

        wait_until(counted, timeout_s=10, what="the lone calls counted")
        # Each counted once, the first "pass" too.
        assert sandbox.pool.counters("agents")["calls"] == 129
        assert sandbox.pool.counters("agents")["ok"] == 129


def test_a_lone_call_whose_host_is_killed_runs_again_elsewhere_once(
    redis_url: str, start_worker: StartWorker
) -> None:
    keys = Keys()
    client = redis.Redis.from_url(redis_url)
    doomed = start_worker(concurrency=1, name="doomed")
    with RemoteSandbox(redis_url, timeout=10.0) as sandbox:
        assert sandbox.run_code("pass").worker == "doomed"
        future = sandbox.submit("import time\ntime.sleep(1.5)\nprint('done')")
        wait_until(
            lambda: client.llen(_in_flight(client, "doomed")) == 1,
            what="the doomed host to take the call",
        )
        _kill_host(doomed)
        start_worker(concurrency=1, name="survivor")
        result = future.result(timeout=60)
        assert (result.stdout, result.worker) == ("done\n", "survivor")
        assert client.llen(_in_flight(client, "doomed")) == 0
        assert client.llen(keys.calls()) == 0
        # One answer only: the reader has nothing more for anyone.
        assert sandbox.pool.calls.waiting() == 0


def test_a_host_killed_right_after_answering_loses_no_count(
    redis_url: str, start_worker: StartWorker
) -> None:
    """docs/chaos.md, finding 5: the counts ride with the replies. Before, they were
    written once a second, and a kill -9 lost those of the calls last answered (this
    test failed so: the counters never reached 21)."""
    keys = Keys()
    client = redis.Redis.from_url(redis_url)
    doomed = start_worker(concurrency=2, name="doomed")
    with RemoteSandbox(redis_url, timeout=10.0, run="counted") as sandbox:
        results = [sandbox.run_code(f"print({i})") for i in range(21)]
        _kill_host(doomed)  # within a second of its last answers
        assert [r.stdout for r in results] == [f"{i}\n" for i in range(21)]
        assert {r.worker for r in results} == {"doomed"}
        start_worker(concurrency=1, name="janitor")  # the lapsed host's janitor

        def counted() -> bool:
            return sandbox.pool.counters("counted").get("calls", 0) >= 21

        wait_until(counted, timeout_s=30, what="the killed host's answers counted")
        seen = sandbox.pool.counters("counted")
        assert (seen["calls"], seen["ok"]) == (21, 21), seen
        assert sandbox.pool.counters()["calls"] == 21
        assert client.keys(keys.host_call_counts("*")) == []  # folded, none left


def test_counts_a_failover_lost_from_the_pending_list_still_count(
    redis_url: str, start_worker: StartWorker
) -> None:
    """A primary that fails over may lose the last pushes onto a host's pending counts
    (replication is asynchronous); the host folds what it pushed, not what the list
    holds. Here the list is emptied by hand right after the calls, as such a loss would
    (before: the fold read the empty list and those calls were never counted)."""
    keys = Keys()
    client = redis.Redis.from_url(redis_url)
    start_worker(concurrency=2, name="survivor")
    with RemoteSandbox(redis_url, timeout=10.0, run="kept") as sandbox:
        results = [sandbox.run_code(f"print({i})") for i in range(21)]
        pending = keys.host_call_counts(start_of(_lease(client, "survivor")))
        client.delete(pending)
        assert [r.stdout for r in results] == [f"{i}\n" for i in range(21)]

        def counted() -> bool:
            return sandbox.pool.counters("kept").get("calls", 0) >= 21

        wait_until(counted, timeout_s=10, what="every call counted")
        time.sleep(1.5)  # a fold more: nothing counted twice
        assert sandbox.pool.counters("kept")["calls"] == 21


def _lease(client: redis.Redis, host: str) -> str:
    lease = client.get(Keys().host_start(host))
    assert lease is not None, f"{host} never took a lease"
    return lease.decode()


def _in_flight(client: redis.Redis, host: str) -> str:
    """The list of ``host``'s latest start's lone calls in flight (worker/lease.py)."""
    lease = client.get(Keys().host_start(host))
    assert lease is not None, f"{host} never took a lease"
    return Keys().host_calls(start_of(lease.decode()))


SLEEPER = "import time\ntime.sleep(120)"
WORKER = "lonely"


def test_a_lone_call_given_up_is_killed_or_never_runs_and_counted_cancelled(
    redis_url: str, start_worker: StartWorker
) -> None:
    pid = start_worker(concurrency=1, name=WORKER).process.pid
    client = redis.Redis.from_url(redis_url)
    with RemoteSandbox(redis_url, timeout=300.0, run="gaveup") as sandbox:
        sandbox.run_code("pass")
        running = sandbox.submit(SLEEPER)
        wait_until(lambda: sleeping_below(pid) == 1, what="the sleeper running")
        # One slot: the host takes one call more than it can run, the third waits.
        queued = sandbox.submit(SLEEPER)
        wait_until(lambda: client.llen(_in_flight(client, WORKER)) == 2, what="one more taken")
        waiting = sandbox.submit(SLEEPER)
        wait_until(lambda: client.llen(Keys().calls()) == 1, what="the third call waiting")
        snippet = sleeping_pids(pid)
        assert waiting.cancel()
        wait_until(lambda: client.llen(Keys().calls()) == 0, what="the waiting call withdrawn")
        assert queued.cancel() and running.cancel()
        wait_until(lambda: not still_running(snippet), KILLED_WITHIN_S, what="the sleeper killed")
        assert sandbox.run_code("print(1)").stdout == "1\n"  # the freed slot serves
        assert sleeping_below(pid) == 0  # the queued sleeper never started

        def counted() -> bool:
            got = sandbox.pool.counters("gaveup")
            return got.get("cancelled", 0) == 3 and got.get("calls", 0) == 2

        wait_until(counted, what="three counted cancelled, the others as calls")
        got = sandbox.pool.counters("gaveup")
        assert (got["calls"], got["ok"], got["cancelled"]) == (2, 2, 3), got
    assert client.llen(_in_flight(client, WORKER)) == 0


def test_every_answer_leaves_its_inbox_with_a_ttl(
    redis_url: str, start_worker: StartWorker
) -> None:
    """A reader that empties an inbox removes its TTL with it; the next answer must set
    it again, or an inbox nobody reads any more never expires (docs/chaos.md, finding
    3; before the fix the second answer within a minute came without one)."""
    start_worker(concurrency=1)
    client = redis.Redis.from_url(redis_url)
    keys = Keys()
    inbox = keys.inbox("nobody-reads")
    limits = Limits().to_dict()
    for turn in range(2):
        client.delete(inbox)  # as a reader that emptied it
        client.rpush(keys.calls(), LoneCall(f"c{turn}", inbox, "print(1)", limits).encode())
        wait_until(lambda: client.llen(inbox) == 1, what=f"answer {turn}")
        assert 0 < client.ttl(inbox) <= INBOX_TTL_S
