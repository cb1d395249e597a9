"""The queue path end to end: real redis-server, real `codepool worker` processes."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter
from datetime import UTC, datetime, timedelta

import redis
from rq import Queue
from rq.job import Job, JobStatus
from rq.registry import FinishedJobRegistry

from codepool.common.codec import MsgpackSerializer, decode_result
from codepool.common.keys import Keys
from codepool.common.ledger import host_beat
from codepool.common.result import LIMITS
from codepool.common.settings import Settings
from codepool.producer import CodePool, RemoteSandbox
from tests.conftest import (
    StartWorker,
    command_lines,
    sleeping_below,
    wait_for_dispatchers,
    wait_until,
)


def test_results_come_back_in_input_order(redis_url: str, start_worker: StartWorker) -> None:
    start_worker()
    pool = CodePool(redis_url)
    codes = [f"import time\ntime.sleep({(7 - i) % 3} * 0.05)\nprint({i})" for i in range(12)]
    codes += ["x = (", "print('<|im_end|>')", None]  # type: ignore[list-item]
    results = pool.submit(codes, timeout_s=5.0).results(timeout_s=60)
    assert [r.stdout for r in results[:12]] == [f"{i}\n" for i in range(12)]
    assert results[12].status == "error" and "SyntaxError" in results[12].stderr
    assert results[13].stdout == "<|im_end|>\n"
    assert results[14].status == "rejected"
    assert all(r.latency > 0 for r in results)


def test_two_workers_share_the_batch_stream(redis_url: str, start_worker: StartWorker) -> None:
    start_worker(name="alpha")
    start_worker(name="beta")
    pool = CodePool(redis_url)
    batches = [pool.submit(["import time\ntime.sleep(0.3)\nprint(1)"] * 2) for _ in range(8)]
    results = [r for batch in batches for r in batch.results(timeout_s=60)]
    assert all(r.ok for r in results)
    assert {r.worker for r in results} == {"alpha", "beta"}


def test_a_straggler_does_not_delay_the_others(redis_url: str, start_worker: StartWorker) -> None:
    start_worker(concurrency=2)
    pool = CodePool(redis_url)
    slow_batch = pool.submit(["import time\ntime.sleep(3)\nprint('slow')"] + ["print(1)"] * 10)
    other = pool.submit(["print(2)"] * 10)
    assert all(r.stdout == "2\n" for r in other.results(timeout_s=30))
    # The other batch was done while the straggler still ran: it has no result yet.
    assert not pool.conn.hexists(pool.keys.batch_results(slow_batch.id), 0)
    order = [index for index, _ in slow_batch.as_completed(timeout_s=30)]
    assert order[-1] == 0, "the 3 s snippet finished before the fast ones"


def test_a_long_first_snippet_keeps_no_batch_off_the_host(
    redis_url: str, start_worker: StartWorker
) -> None:
    # A dispatcher keeps the host's listen turn while its first snippets settle
    # (Dispatcher.execute_job), but only briefly: the other dispatcher takes the next
    # announcement long before the first snippet ends.
    worker = start_worker(concurrency=2)
    pool = CodePool(redis_url)
    slow = pool.submit(["import time\ntime.sleep(3)\nprint('slow')"])
    wait_until(lambda: sleeping_below(worker.process.pid) > 0, what="the slow snippet to start")
    quick = pool.submit(["print('quick')"])
    assert quick.results(timeout_s=30)[0].stdout == "quick\n"
    # The quick one was answered while the slow one still ran.
    assert not pool.conn.hexists(pool.keys.batch_results(slow.id), 0)
    assert slow.results(timeout_s=30)[0].stdout == "slow\n"


def test_stats_counters_equal_what_ran(redis_url: str, start_worker: StartWorker) -> None:
    start_worker()
    pool = CodePool(redis_url)
    codes = ["print(1)"] * 3 + ["1/0", "import sys\nsys.exit(2)", "while True: pass", None]
    results = pool.submit(codes, timeout_s=1.0, run="exp-stats").results(timeout_s=60)
    assert [r.status for r in results] == ["ok"] * 3 + ["error"] * 2 + ["timeout", "rejected"]
    expected = {"calls": 7, "ok": 3, "error": 2, "timeout": 1, "rejected": 1}

    def counted() -> bool:
        got = pool.counters(run="exp-stats")
        return all(got.get(k, 0) == v for k, v in expected.items())

    wait_until(counted, timeout_s=10)
    assert {k: pool.counters().get(k, 0) for k in expected} == expected
    metrics = pool.metrics(run="exp-stats")
    assert metrics["sandbox/success_rate"] == 3 / 7
    assert metrics["sandbox/timeout_rate"] == 1 / 7
    client = redis.Redis.from_url(redis_url)
    keys = Keys()
    minute = [k for k in client.keys(keys.minute_stats(0).replace(":0", ":*"))]
    # The TTLs are the settings' own (less the seconds this test took), not just "some".
    minute_ttl = pool.settings.minute_stats_ttl_s
    assert minute and all(minute_ttl - 120 < client.ttl(k) <= minute_ttl for k in minute)
    assert client.hget(keys.worker_stats("w0-" + str(os.getpid())), "calls") == b"7"


def test_each_limit_is_named_in_the_result_and_counted_once(
    redis_url: str, start_worker: StartWorker
) -> None:
    start_worker()
    pool = CodePool(redis_url)
    fork_past_the_cap = (
        "import os\nr, w = os.pipe()\nfor _ in range(64):\n"
        "    if os.fork() == 0:\n        os.close(w)\n        os.read(r, 1)\n        os._exit(0)"
    )
    capped = {
        "memory": "x = bytearray(512 << 20)",
        "file_size": "open('big', 'wb').write(b'x' * (2 << 20))",
        "processes": fork_past_the_cap,
        "output": "print('x' * 5000)",
        None: "print(1)",
    }
    small = dict(memory_mb=128, max_file_mb=1, max_procs=4, max_output_chars=100)
    batches = [
        (["wall_time"], pool.submit(["import time\ntime.sleep(60)"], timeout_s=0.5, run="lim")),
        (["cpu_time"], pool.submit(["while True: pass"], cpu_s=1.0, timeout_s=60, run="lim")),
        (list(capped), pool.submit(list(capped.values()), timeout_s=30, run="lim", **small)),
    ]
    for names, batch in batches:
        results = batch.results(timeout_s=120)
        assert [r.limit for r in results] == names, results
    # Counted with the write that made each result visible: no wait needed.
    expected = {f"limit_{name}": 1 for name in LIMITS}
    for run in ("lim", None):
        got = pool.counters(run=run)
        assert {field: got.get(field, 0) for field in expected} == expected, run
        assert got["calls"] == 7
    assert pool.metrics(run="lim")["sandbox/limit_cpu_time"] == 1.0


def test_every_per_batch_key_expires(redis_url: str, start_worker: StartWorker) -> None:
    start_worker()
    pool = CodePool(redis_url)
    batch = pool.submit(["print(1)"] * 5)
    assert all(r.ok for r in batch.results(timeout_s=30))
    client = redis.Redis.from_url(redis_url)
    keys = Keys()
    results_key = keys.batch_results(batch.id)
    assert client.exists(results_key)
    batch_ttl = pool.settings.batch_ttl_s
    assert batch_ttl - 60 < client.ttl(results_key) <= batch_ttl
    # The done list was drained by the producer; whatever per-batch key exists expires,
    # within the batch TTL.
    per_batch = client.keys(keys.batch_results("*").rsplit(":", 1)[0] + ":*")
    assert per_batch and all(0 < client.ttl(k) <= batch_ttl for k in per_batch)
    # RQ's own records of the batch's announcements expire too (short result TTL).
    finished = FinishedJobRegistry("codepool", connection=client, serializer=MsgpackSerializer)
    wait_until(lambda: any(j.startswith(batch.id) for j in finished.get_job_ids()))
    announcements = [j for j in finished.get_job_ids() if j.startswith(batch.id)]
    for job_id in announcements:
        job = Job.fetch(job_id, connection=client, serializer=MsgpackSerializer)
        assert job.get_status() == JobStatus.FINISHED
        result_ttl = pool.settings.job_result_ttl_s
        assert result_ttl - 30 < client.ttl(job.key) <= result_ttl
    # What a replay reads: the results hash holds every index.
    stored = client.hgetall(results_key)
    assert sorted(int(k) for k in stored) == list(range(5))
    assert all(decode_result(v).ok for v in stored.values())


def test_a_job_naming_another_function_is_refused(
    redis_url: str, start_worker: StartWorker, tmp_path: object
) -> None:
    worker = start_worker()
    marker = f"/tmp/codepool-pwned-{os.getpid()}"
    client = redis.Redis.from_url(redis_url)
    queue = Queue("codepool", connection=client, serializer=MsgpackSerializer)
    job = queue.enqueue("os.system", f"touch {marker}")
    wait_until(lambda: job.get_status(refresh=True) == JobStatus.FAILED, timeout_s=15)
    assert not os.path.exists(marker)
    assert "refusing job" in worker.log() and "os.system" in worker.log()
    pool = CodePool(redis_url)
    assert pool.submit(["print('still serving')"]).results(timeout_s=30)[0].ok


def test_the_announcement_made_ahead_goes_out_as_made_at_submit(redis_url: str) -> None:
    # A pool makes its next batch's id and announcement once a batch is in (no worker
    # here: the announcements stay on the queue to be looked at).
    client = redis.Redis.from_url(redis_url)
    pool = CodePool(redis_url)
    first = pool.submit(["print('first')"])
    assert pool._spare is None, "made beside the work a submit starts"
    assert first.results(timeout_s=0.1)[0].status == "infra"  # no worker: in, as infra
    wait_until(lambda: pool._spare is not None, what="the spare announcement")
    spare = pool._spare
    assert spare is not None and spare[0] != first.id
    time.sleep(0.05)
    before = datetime.now(UTC) - timedelta(milliseconds=1)
    batch = pool.submit(["print('not in the description')"] * 3)
    assert batch.id == spare[0]
    queue = Queue("codepool", connection=client, serializer=MsgpackSerializer)
    jobs = [Job.fetch(i, connection=client, serializer=MsgpackSerializer) for i in queue.job_ids]
    [job] = [job for job in jobs if job.id.startswith(batch.id + "-")]
    assert job.id == spare[1].id
    assert job.description == f"codepool batch {batch.id} (3 snippets)"
    assert job.created_at is not None and job.created_at >= before
    assert job.get_status() == JobStatus.QUEUED


def test_a_submit_announces_to_hosts_that_went_live_since_the_previous_one(
    redis_url: str,
) -> None:
    # No worker: the announcements stay on the queue to be counted.
    client = redis.Redis.from_url(redis_url)
    pool = CodePool(redis_url)
    queue = Queue("codepool", connection=client, serializer=MsgpackSerializer)

    def announced(batch_id: str) -> int:
        return sum(job_id.startswith(batch_id + "-") for job_id in queue.job_ids)

    first = pool.submit(["print(1)"] * 10)
    assert announced(first.id) == 1  # no host live
    keys, lease_s = pool.settings.keys, pool.settings.lease_s
    for host in ("a", "b", "c"):
        host_beat(client, keys, host=host, lease_s=lease_s, first=True, new=[f"{host}.0"])
    # Counted from the previous submit (none live), the store says three are live now.
    assert announced(pool.submit(["print(2)"] * 10).id) == 3
    assert announced(pool.submit(["print(3)"] * 10).id) == 3
    pool.close()
    client.close()


def test_remote_sandbox_across_event_loops(redis_url: str, start_worker: StartWorker) -> None:
    start_worker()
    with RemoteSandbox(redis_url, timeout=5.0) as sandbox:

        async def step(k: int) -> list[str]:
            results = await asyncio.gather(
                *(sandbox.arun_code(f"print({k} * {j})") for j in range(30))
            )
            return [sandbox.format_tool_content(r) for r in results]

        for k in range(3):  # a new event loop per training step, one sandbox
            assert asyncio.run(step(k)) == [f"{k * j}\n" for j in range(30)]
        assert sandbox.run_code("print(2 + 3)").stdout == "5\n"
        timeout = sandbox.run_code("while True: pass")
        assert sandbox.format_tool_content(timeout) == "Error: execution timed out after 5 seconds."
        metrics = sandbox.stats.metrics()
        assert metrics["sandbox/calls"] == 92 and metrics["sandbox/timeout_rate"] == 1 / 92


def test_no_pickle_anywhere_in_redis(redis_url: str, start_worker: StartWorker) -> None:
    start_worker()
    pool = CodePool(redis_url)
    pool.submit(["print(1)", "1/0"], run="pickle-check").results(timeout_s=30)
    client = redis.Redis.from_url(redis_url)
    queue = Queue("codepool", connection=client, serializer=MsgpackSerializer)
    refused = queue.enqueue("os.getcwd")
    wait_until(lambda: refused.get_status(refresh=True) == JobStatus.FAILED, timeout_s=15)
    stats_key = Settings.from_env(redis_url=redis_url).keys.stats()
    wait_until(lambda: int(client.hget(stats_key, "calls") or 0) >= 2, what="counters flushed")
    values: list[bytes] = []
    for key in client.scan_iter():
        kind = client.type(key)
        if kind == b"string":
            values.append(client.get(key) or b"")
        elif kind == b"hash":
            values.extend(client.hgetall(key).values())
        elif kind == b"list":
            values.extend(client.lrange(key, 0, -1))
        elif kind in (b"set", b"zset"):
            values.extend(client.smembers(key) if kind == b"set" else client.zrange(key, 0, -1))
        elif kind == b"stream":
            for _, fields in client.xrange(key):
                values.extend(fields.values())
    assert len(values) > 10
    pickled = [v[:20] for v in values if len(v) > 1 and v[0] == 0x80 and v[1] in (2, 3, 4, 5)]
    assert pickled == []


def test_first_sigterm_finishes_in_flight_and_the_rest_runs_elsewhere(
    redis_url: str, start_worker: StartWorker
) -> None:
    first = start_worker(concurrency=2, name="first")
    pool = CodePool(redis_url)
    batch = pool.submit([f"import time\ntime.sleep(1)\nprint({i})" for i in range(8)])
    state = Settings.from_env(redis_url=redis_url).keys.batch_state(batch.id)
    client = redis.Redis.from_url(redis_url)
    wait_until(lambda: int(client.hget(state, "next") or 0) > 0, what="the first claim")
    # Claimed is not started: a SIGTERM between the two gives every snippet back.
    wait_until(lambda: sleeping_below(first.process.pid) > 0, what="a snippet running")
    first.process.send_signal(signal.SIGTERM)
    assert first.process.wait(timeout=20) == 0
    start_worker(concurrency=2, name="second")
    results = batch.results(timeout_s=60)
    outcomes = [(r.status, r.worker, r.stderr[-120:]) for r in results]
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(8)], outcomes
    # What was in flight finished on the first worker; the rest ran on the second.
    by_worker = Counter(r.worker for r in results)
    assert set(by_worker) == {"first", "second"} and by_worker["first"] < 8, by_worker


def test_restart_after_kill_9_reuses_the_name(redis_url: str, start_worker: StartWorker) -> None:
    first = start_worker(name="phoenix")
    first.process.kill()
    first.process.wait()
    second = start_worker(name="phoenix")
    assert CodePool(redis_url).submit(["print(1)"]).results(timeout_s=30)[0].ok
    assert second.process.poll() is None


def test_redis_url_from_the_environment(redis_url: str, start_worker: StartWorker) -> None:
    worker = start_worker(url=None, env={"REDIS_URL": redis_url}, wait=False)
    wait_for_dispatchers(redis_url, worker.name, worker)
    assert CodePool(redis_url).submit(["print(1)"]).results(timeout_s=30)[0].ok


def test_async_producer_api_and_threads(redis_url: str, start_worker: StartWorker) -> None:
    start_worker()
    pool = CodePool(redis_url)

    async def main() -> tuple[list[str], list[int]]:
        batch = await pool.asubmit([f"print({i})" for i in range(6)], timeout_s=5.0)
        order = [i async for i, _ in batch.aas_completed(timeout_s=30)]
        results = await batch.aresults(timeout_s=30)
        return [r.stdout for r in results], order

    stdouts, order = asyncio.run(main())
    assert stdouts == [f"{i}\n" for i in range(6)] and sorted(order) == list(range(6))
    from concurrent.futures import ThreadPoolExecutor

    with RemoteSandbox(redis_url, timeout=5.0) as sandbox, ThreadPoolExecutor(8) as threads:
        outs = list(threads.map(lambda i: sandbox.run_code(f"print({i} + 1)").stdout, range(24)))
    assert outs == [f"{i + 1}\n" for i in range(24)]


def test_burst_worker_exits_when_the_queue_is_empty(
    redis_url: str, start_worker: StartWorker
) -> None:
    pool = CodePool(redis_url)
    batch = pool.submit(["print('burst')"] * 3)
    worker = start_worker("--burst", wait=False)
    assert [r.stdout for r in batch.results(timeout_s=30)] == ["burst\n"] * 3
    assert worker.process.wait(timeout=30) == 0


def test_dispatchers_get_the_redis_url_off_their_command_line(
    redis_url: str, start_worker: StartWorker
) -> None:
    start_worker()
    dispatchers = command_lines("codepool.worker.dispatcher")
    assert len(dispatchers) >= 2
    assert not any(redis_url in cmdline for cmdline in dispatchers)


def test_the_producers_linger_never_holds_up_a_batchs_end(
    redis_url: str, start_worker: StartWorker
) -> None:
    start_worker()
    # A linger longer than the test may take: reads wait no longer than the rest of the
    # batch should take at the pace so far, so the batch ends when its results are in.
    settings = Settings.from_env(redis_url=redis_url).replace(collect_linger_s=600.0)
    pool = CodePool(redis_url, settings=settings)
    n = 40
    results = pool.submit([f"print({i})" for i in range(n)]).results(timeout_s=60)
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(n)], [r.status for r in results]
