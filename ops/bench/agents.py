"""Agentic load benchmark: P producer processes x T trajectories, each making one call at
a time with a random think time between them, through Redis (RemoteSandbox) and through
``codepool serve`` (HTTP, a kept-alive session per trajectory), beside the batched figures
(one gather of many calls) of the same run, against one private Redis and one worker host.

Per scenario it prints, per call: Redis commands (INFO commandstats deltas), Redis CPU
(used_cpu_sys + used_cpu_user deltas), p50/p99 latency and throughput; the idle rate of
the fleet (measured before) is subtracted from the commands and CPU. A report, not a test.

    python -m codepool.ops.bench.agents [--seconds 5] [--think-ms 40] [--skip-serve]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import redis

from codepool.common.quantile import nearest_rank
from codepool.ops.arguments import cli_command
from codepool.ops.bench.e2e import stop_worker, worker_process
from codepool.ops.redis_server import RedisServer
from codepool.producer import RemoteSandbox

CODE = "print(2 + 3)"
TIMEOUT_S = 5.0
SETTLE_S = 1.2  # hosts flush their counters within a second: charged to the scenario
FLOOR_S = 3.0
GATHER = 400
# (name, producers, trajectories, think_ms): think_ms None takes --think-ms.
SCENARIOS: tuple[tuple[str, int, int, float | None], ...] = (
    ("lone, one caller", 1, 1, 0.0),
    ("2 x 2 agents", 2, 2, None),
    ("4 x 2 agents", 4, 2, None),
    ("8 x 4 agents", 8, 4, None),
)


@dataclass
class Row:
    path: str
    scenario: str
    calls: int
    seconds: float
    commands: float  # per call
    cpu_us: float  # per call
    p50_ms: float
    p99_ms: float

    @property
    def per_s(self) -> float:
        return self.calls / self.seconds if self.seconds else 0.0


class Meter:
    """INFO deltas of one Redis, less the fleet's idle rate."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.idle_cmds_s = 0.0
        self.idle_cpu_s = 0.0

    def read(self) -> tuple[int, float, float]:
        stats: dict[str, Any] = self.client.info("commandstats")
        cpu: dict[str, Any] = self.client.info("cpu")
        commands = sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")
        return commands, float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]), time.monotonic()

    def floor(self, seconds: float) -> None:
        c0, u0, t0 = self.read()
        time.sleep(seconds)
        c1, u1, t1 = self.read()
        self.idle_cmds_s = max(0.0, (c1 - c0 - 2) / (t1 - t0))
        self.idle_cpu_s = max(0.0, (u1 - u0) / (t1 - t0))

    def per_call(
        self, before: tuple[int, float, float], after: tuple[int, float, float], calls: int
    ) -> tuple[float, float]:
        elapsed = after[2] - before[2]
        commands = after[0] - before[0] - 2 - self.idle_cmds_s * elapsed  # 2: the INFOs
        cpu = after[1] - before[1] - self.idle_cpu_s * elapsed
        return max(0.0, commands) / calls, max(0.0, cpu) / calls * 1e6


# -- producers (each its own process) ---------------------------------------------------


def _trajectories(
    call: Callable[[int], None], trajectories: int, seconds: float, think_ms: float, go: Any
) -> list[float]:
    latencies: list[float] = []
    lock = threading.Lock()
    go.wait()
    end = time.monotonic() + seconds

    def one(index: int) -> None:
        rng = random.Random(index * 7919 + os.getpid())
        mine: list[float] = []
        while time.monotonic() < end:
            if think_ms:
                time.sleep(rng.uniform(0, think_ms) / 1e3)
            began = time.perf_counter()
            call(index)
            mine.append(time.perf_counter() - began)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(trajectories)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return latencies


def redis_producer(
    url: str, trajectories: int, seconds: float, think_ms: float, go: Any, ready: Any
) -> list[float]:
    with RemoteSandbox(url, timeout=TIMEOUT_S) as sandbox:
        sandbox.run_code(CODE)

        def call(_: int) -> None:
            result = sandbox.run_code(CODE)
            if result.stdout != "5\n":
                raise RuntimeError(f"bad result: {result}")

        ready.put(None)
        return _trajectories(call, trajectories, seconds, think_ms, go)


def serve_producer(
    url: str, trajectories: int, seconds: float, think_ms: float, go: Any, ready: Any
) -> list[float]:
    import requests

    sessions = [requests.Session() for _ in range(trajectories)]
    body: dict[str, Any] = {"code": CODE, "language": "python", "run_timeout": TIMEOUT_S}
    for session in sessions:
        session.post(f"{url}/run_code", json=body, timeout=60)

    def call(index: int) -> None:
        reply = sessions[index].post(f"{url}/run_code", json=body, timeout=60)
        if reply.status_code != 200 or reply.json()["run_result"]["stdout"] != "5\n":
            raise RuntimeError(f"bad reply: {reply.status_code} {reply.text[:200]}")

    ready.put(None)
    return _trajectories(call, trajectories, seconds, think_ms, go)


def _run_producer(
    path: str,
    url: str,
    trajectories: int,
    seconds: float,
    think_ms: float,
    go: Any,
    ready: Any,
    out: Any,
) -> None:
    run = redis_producer if path == "redis" else serve_producer
    try:
        out.put(run(url, trajectories, seconds, think_ms, go, ready))
    except Exception as exc:
        ready.put(None)
        out.put(exc)


# -- scenarios ---------------------------------------------------------------------------


def agents(
    meter: Meter,
    path: str,
    url: str,
    name: str,
    producers: int,
    trajectories: int,
    seconds: float,
    think_ms: float,
) -> Row:
    context = multiprocessing.get_context("spawn")
    go, ready, out = context.Event(), context.Queue(), context.Queue()
    processes = [
        context.Process(
            target=_run_producer,
            args=(path, url, trajectories, seconds, think_ms, go, ready, out),
        )
        for _ in range(producers)
    ]
    for process in processes:
        process.start()
    for _ in processes:  # all started and warmed up
        ready.get(timeout=120)
    before = meter.read()
    go.set()
    samples: list[float] = []
    for _ in processes:
        got = out.get(timeout=seconds + 120)
        if isinstance(got, Exception):
            raise got
        samples += got
    for process in processes:
        process.join()
    time.sleep(SETTLE_S)
    after = meter.read()
    calls = len(samples)
    commands, cpu_us = meter.per_call(before, after, calls)
    samples.sort()
    return Row(
        path,
        name,
        calls,
        seconds,
        commands,
        cpu_us,
        nearest_rank(samples, 0.5) * 1e3,
        nearest_rank(samples, 0.99) * 1e3,
    )


def batched(meter: Meter, url: str, rounds: int) -> Row:
    with RemoteSandbox(url, timeout=TIMEOUT_S) as sandbox:

        async def gather() -> list[Any]:
            return await asyncio.gather(*(sandbox.arun_code(CODE) for _ in range(GATHER)))

        asyncio.run(gather())
        time.sleep(SETTLE_S)
        before = meter.read()
        began = time.perf_counter()
        for _ in range(rounds):
            results = asyncio.run(gather())
            assert all(r.stdout == "5\n" for r in results)
        seconds = time.perf_counter() - began
        time.sleep(SETTLE_S)
        after = meter.read()
    calls = GATHER * rounds
    commands, cpu_us = meter.per_call(before, after, calls)
    return Row("redis", f"gather of {GATHER} (batched)", calls, seconds, commands, cpu_us, 0, 0)


def context_calls(meter: Meter, url: str, n: int) -> Row:
    with RemoteSandbox(url, timeout=TIMEOUT_S) as sandbox, sandbox.context() as context:
        context.run_code("x = 1")
        before = meter.read()
        samples = []
        for _ in range(n):
            began = time.perf_counter()
            context.run_code(CODE)
            samples.append(time.perf_counter() - began)
        seconds = sum(samples)
        time.sleep(SETTLE_S)
        after = meter.read()
    commands, cpu_us = meter.per_call(before, after, n)
    samples.sort()
    return Row(
        "redis",
        "context call, one caller",
        n,
        seconds,
        commands,
        cpu_us,
        nearest_rank(samples, 0.5) * 1e3,
        nearest_rank(samples, 0.99) * 1e3,
    )


@contextmanager
def serve_process(url: str, workdir: str) -> Iterator[str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = open(os.path.join(workdir, "serve.log"), "wb")
    process = subprocess.Popen(
        cli_command("serve", "--url", url, "--host", "127.0.0.1", "--port", str(port)),
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        import requests

        deadline = time.monotonic() + 60
        while True:
            try:
                if requests.get(f"{endpoint}/health", timeout=1).ok:
                    break
            except requests.RequestException:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("serve did not come up")
            time.sleep(0.1)
        yield endpoint
    finally:
        stop_worker(process)
        log.close()


def print_rows(rows: list[Row], batched_per_s: float) -> None:
    print(
        f"{'path':6} {'scenario':28} {'calls':>6} {'calls/s':>8} {'vs batch':>8} "
        f"{'cmds/call':>9} {'cpu us/call':>11} {'p50 ms':>7} {'p99 ms':>7}"
    )
    for row in rows:
        share = f"{row.per_s / batched_per_s:7.0%}" if batched_per_s else "-"
        print(
            f"{row.path:6} {row.scenario:28} {row.calls:6d} {row.per_s:8.0f} {share:>8} "
            f"{row.commands:9.1f} {row.cpu_us:11.0f} {row.p50_ms:7.2f} {row.p99_ms:7.2f}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="per scenario")
    parser.add_argument("--think-ms", type=float, default=40.0, help="think time 0..this")
    parser.add_argument("--skip-serve", action="store_true")
    args = parser.parse_args(argv)
    with ExitStack() as stack:
        workdir = stack.enter_context(tempfile.TemporaryDirectory(prefix="codepool-agents-"))
        server = stack.enter_context(RedisServer())
        client = redis.Redis.from_url(server.url)
        meter = Meter(client)
        stack.enter_context(worker_process(server.url, workdir))
        with RemoteSandbox(server.url, timeout=TIMEOUT_S) as sandbox:
            deadline = time.monotonic() + 60
            while sandbox.run_code(CODE).stdout != "5\n":
                if time.monotonic() > deadline:
                    raise RuntimeError("worker not ready")
        time.sleep(SETTLE_S)
        meter.floor(FLOOR_S)
        print(
            f"idle fleet: {meter.idle_cmds_s:.2f} commands/s, {meter.idle_cpu_s * 1e6:.0f} us CPU/s"
        )
        print(f"load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
        rows = [batched(meter, server.url, 3)]
        rows.append(context_calls(meter, server.url, 300))
        paths = [("redis", server.url)]
        if not args.skip_serve:
            paths.append(("serve", stack.enter_context(serve_process(server.url, workdir))))
        for path, url in paths:
            for name, producers, trajectories, think in SCENARIOS:
                think_ms = args.think_ms if think is None else think
                label = f"{name}, think 0-{think_ms:.0f} ms" if think_ms else name
                rows.append(
                    agents(meter, path, url, label, producers, trajectories, args.seconds, think_ms)
                )
                print_rows(rows[-1:], rows[0].per_s)
        print()
        print_rows(rows, rows[0].per_s)
        print(f"load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
