"""End-to-end benchmark: RemoteSandbox -> private Redis -> one `codepool worker` vs the reference.

One run starts its own redis-server and worker, drives them through the producer's drop-in
``RemoteSandbox``, and runs the same workloads through the reference subprocess sandbox
in-process, so the ratios come from the same machine in the same minute. This is a report,
not a test: it exits 0 whatever the numbers say, and non-zero only when something crashed.

    python ops/bench/e2e.py [--scale 1.0] [--skip-reference] [--commands]
    python -m codepool.ops.bench.e2e
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import redis

from codepool.common import ExecResult
from codepool.common.quantile import nearest_rank
from codepool.common.settings import Settings
from codepool.ops.arguments import cli_command
from codepool.ops.bench.executor import (
    NUMPY_CODE,
    PRINT_CODE,
    SYMPY_CODE,
    Measurement,
    ReferenceExecutor,
    Workload,
    measure,
    median_of_ratios,
)
from codepool.ops.bench.side_by_side import alternate, print_interpreter_startup
from codepool.ops.redis_server import RedisServer
from codepool.producer import RemoteSandbox

TIMEOUT_S = 5.0
WORKER_SLOTS = 2
READY_TIMEOUT_S = 60.0
WORKER_STOP_GRACE_S = 30.0
# Dispatchers flush their stats counters up to 1 s after a batch; reading INFO sooner
# would charge those commands to the next workload.
STATS_SETTLE_S = 1.2
# How long the bare server is watched for its idle CPU rate before the worker starts.
FLOOR_S = 5.0
LONE_PAUSE_S = 0.02
# Bounds a hang on a broken worker to a minute instead of the sandbox's timeout + 300 s.
SANDBOX_DEADLINE_S = 60.0

THROUGHPUT_TARGETS = (("print", 6.0), ("numpy", 15.0))
LONE_P50_TARGET_MS = 4.0
REDIS_CMDS_PER_SNIPPET_TARGET = 6.0
REDIS_CPU_US_PER_SNIPPET_TARGET = 25.0
REFERENCE, E2E = "reference", "codepool-e2e"


class SandboxRunner:
    """The bench's ``Runner`` protocol over a RemoteSandbox, driven the way a trainer would:
    ``asyncio.run`` of one gather of ``arun_code`` per rollout step."""

    def __init__(self, sandbox: RemoteSandbox) -> None:
        self.sandbox = sandbox
        # Kept for the breakdown: `measure` reduces results to percentiles and drops them.
        self.seen: list[ExecResult] = []

    def run(self, code: str, *, timeout_s: float) -> ExecResult:
        result = self.sandbox.run_code(code)  # the sandbox's own timeout applies
        self.seen.append(result)
        return result

    def run_many(self, codes: Sequence[str], *, timeout_s: float) -> list[ExecResult]:
        async def step() -> list[ExecResult]:
            return list(await asyncio.gather(*(self.sandbox.arun_code(c) for c in codes)))

        results = asyncio.run(step())
        self.seen.extend(results)
        return results


@dataclass
class Row:
    measurement: Measurement
    redis_cmds: int | None = None  # commands Redis served during the workload (e2e only)
    redis_cpu_s: float | None = None  # CPU Redis spent meanwhile, less its idle floor
    seen: Sequence[ExecResult] = ()  # e2e only: the results, for the time breakdown
    redis_raw_cpu_s: float | None = None  # the same with the idle floor (INFO cpu delta)
    per_command: dict[str, tuple[int, int]] | None = None  # e2e only: calls, usec


def build_workloads(scale: float) -> list[Workload]:
    def same(name: str, code: str, base: int, *, sequential: bool = False) -> Workload:
        n = max(1, round(base * scale))
        return Workload(name, (code,) * n, ("ok",) * n, TIMEOUT_S, sequential)

    return [
        same("print", PRINT_CODE, 400),
        same("numpy", NUMPY_CODE, 150),
        same("sympy", SYMPY_CODE, 40),
        same("lone", PRINT_CODE, 50, sequential=True),
    ]


def measure_lone(run: Callable[[str], ExecResult], workload: Workload) -> Measurement:
    """Sequential calls with a pause between them, so each one meets an idle system.

    Per-call wall time around ``run`` rather than ``ExecResult.latency``: that is what a
    rollout loop waits for, including the producer's coalescing linger.
    """
    times: list[float] = []
    bad = 0
    for code, want in zip(workload.codes, workload.expected, strict=True):
        time.sleep(LONE_PAUSE_S)
        call_started = time.perf_counter()
        result = run(code)
        times.append(time.perf_counter() - call_started)
        bad += result.status != want
    # The pauses are not work; leaving them out keeps snip/s comparable between executors.
    times.sort()
    return Measurement(
        n=len(times),
        wall_s=sum(times),
        p50_ms=nearest_rank(times, 0.5) * 1000,
        p95_ms=nearest_rank(times, 0.95) * 1000,
        bad=bad,
        sequential=True,
    )


def redis_cpu_s(client: redis.Redis) -> float:
    """CPU seconds the server has used since start (user + system, all its threads)."""
    cpu = client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def redis_calls(client: redis.Redis) -> dict[str, tuple[int, int]]:
    """Per command: calls and usec the server has spent in it since start, this INFO
    not included (the server counts it after answering). Commands a Lua script sends
    count as calls of their own, and their time is in the script's usec too."""
    stats = client.info("commandstats")
    return {
        k.removeprefix("cmdstat_"): (int(v["calls"]), int(v["usec"]))
        for k, v in stats.items()
        if k.startswith("cmdstat_")
    }


def calls_between(
    before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]
) -> dict[str, tuple[int, int]]:
    """Per command: calls and usec from ``before`` to ``after``, nonzero ones only."""
    delta = {}
    for name, (calls, usec) in after.items():
        calls_before, usec_before = before.get(name, (0, 0))
        if calls > calls_before:
            delta[name] = (calls - calls_before, usec - usec_before)
    return delta


def idle_server_cpu_rate(client: redis.Redis, seconds: float = FLOOR_S) -> float:
    """CPU seconds per second an idle server spends on its own (its cron runs ``hz``
    times a second whether or not anyone uses it), measured before any worker connects."""
    started, cpu_before = time.monotonic(), redis_cpu_s(client)
    time.sleep(seconds)
    return (redis_cpu_s(client) - cpu_before) / (time.monotonic() - started)


def measure_e2e(
    runner: SandboxRunner, client: redis.Redis, workload: Workload, floor_rate: float
) -> Row:
    runner.seen = []
    # The bench's own INFO calls stay outside the CPU window: commandstats before the
    # first CPU reading, and after the last.
    before = redis_calls(client)
    cpu_before, started = redis_cpu_s(client), time.monotonic()
    if workload.sequential:
        m = measure_lone(lambda code: runner.run(code, timeout_s=workload.timeout_s), workload)
    else:
        m = measure(runner, workload, E2E)
    time.sleep(STATS_SETTLE_S)
    cpu_s = redis_cpu_s(client) - cpu_before
    # What the idle server would have spent anyway is not the snippets' cost; what the
    # worker's idle background (heartbeats, RQ's own loops) costs is: a real cost of the
    # system, charged to the snippets that ran meanwhile.
    floor_s = floor_rate * (time.monotonic() - started)
    per_command = calls_between(before, redis_calls(client))
    # Minus the "before" commandstats INFO and the two INFO cpu calls.
    calls, usec = per_command.pop("info", (0, 0))
    if calls > 3:
        per_command["info"] = (calls - 3, usec)
    cmds = sum(calls for calls, _ in per_command.values())
    return Row(m, cmds, cpu_s - floor_s, runner.seen, cpu_s, per_command)


@contextmanager
def worker_process(url: str, workdir: str) -> Iterator[subprocess.Popen[bytes]]:
    """One ``codepool worker`` host in its own session, stopped like an operator would."""
    log_path = os.path.join(workdir, "worker.log")
    # TMPDIR under our temp dir: whatever the worker leaves behind after a SIGKILL
    # (its zygote socket dir) goes when we remove that dir.
    env = {**os.environ, "TMPDIR": workdir}
    with open(log_path, "wb") as log:
        # A new session: a terminal Ctrl-C reaches only us, and we stop the worker in
        # order (SIGTERM, grace, then SIGKILL to the whole group, dispatchers and zygote).
        process = subprocess.Popen(
            cli_command("worker", "--url", url, "-c", str(WORKER_SLOTS)),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    try:
        yield process
    except Exception:  # not on Ctrl-C: the user knows why it stopped
        print("--- worker log tail (its temp dir is removed on exit) ---", file=sys.stderr)
        print(_tail(log_path, 40), file=sys.stderr)
        raise
    finally:
        stop_worker(process)


def stop_worker(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM a worker host started in its own session, then SIGKILL its group."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=WORKER_STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            print("worker ignored SIGTERM for 30 s; killing its group", file=sys.stderr)
    # Also after a clean exit: anything the host failed to reap still carries its pgid.
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def _tail(path: str, lines: int) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError as exc:
        return f"(no log: {exc})"


def wait_ready(
    process: subprocess.Popen[bytes], client: redis.Redis, workers_key: str, runner: SandboxRunner
) -> float:
    """Block until the worker heartbeats and a warm-up batch comes back; return seconds."""
    started = time.monotonic()
    deadline = started + READY_TIMEOUT_S
    while client.zcard(workers_key) == 0:
        if process.poll() is not None:
            raise RuntimeError(f"worker exited with {process.returncode} before heartbeating")
        if time.monotonic() > deadline:
            raise RuntimeError(f"no worker heartbeat in {workers_key} after {READY_TIMEOUT_S} s")
        time.sleep(0.1)
    # The heartbeat proves the host is up, not that dispatchers and zygote preloads are.
    # First calls also pay for page cache and lazy imports; none of that belongs in the table.
    warm = runner.run_many(
        [PRINT_CODE] * 20 + [NUMPY_CODE] * 5 + [SYMPY_CODE] * 5, timeout_s=TIMEOUT_S
    )
    bad = [r for r in warm if r.status != "ok"]
    if bad:
        raise RuntimeError(
            f"warm-up: {len(bad)} of {len(warm)} not ok, e.g. "
            f"status={bad[0].status} stderr={bad[0].stderr[-200:]!r}"
        )
    if time.monotonic() > deadline:
        raise RuntimeError(f"worker not ready within {READY_TIMEOUT_S} s")
    return time.monotonic() - started


@contextmanager
def open_reference() -> Iterator[Callable[[Workload], Row]]:
    with ReferenceExecutor() as ref:
        ref.run_many([PRINT_CODE, NUMPY_CODE, SYMPY_CODE] * 5, timeout_s=TIMEOUT_S)  # warm-up

        def run(w: Workload) -> Row:
            if w.sequential:
                return Row(measure_lone(lambda code: ref.run(code, timeout_s=w.timeout_s), w))
            return Row(measure(ref, w, REFERENCE))

        yield run


@contextmanager
def open_e2e() -> Iterator[Callable[[Workload], Row]]:
    with ExitStack() as stack:
        server = RedisServer().start()
        stack.callback(server.close)
        workdir = tempfile.mkdtemp(prefix="codepool-bench-e2e-")
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        client = redis.Redis.from_url(server.url)
        stack.callback(client.close)
        floor_rate = idle_server_cpu_rate(client)
        print(
            f"idle redis-server (no worker yet): {floor_rate * 1e6:.0f} us CPU per second, "
            "subtracted from every e2e row's Redis CPU",
            file=sys.stderr,
        )
        # Entered after Redis, so it exits before: the worker stops while Redis is still
        # there for it to finish in-flight snippets and deregister.
        process = stack.enter_context(worker_process(server.url, workdir))
        sandbox = RemoteSandbox(server.url, timeout=TIMEOUT_S, deadline_s=SANDBOX_DEADLINE_S)
        stack.callback(sandbox.close)
        runner = SandboxRunner(sandbox)
        workers_key = Settings.from_env(redis_url=server.url).keys.workers()
        ready_s = wait_ready(process, client, workers_key, runner)
        print(f"worker ready (heartbeat + warm-up) after {ready_s:.1f} s", file=sys.stderr)
        yield lambda w: measure_e2e(runner, client, w, floor_rate)


# Every round's row, per side and workload.
Results = dict[str, dict[str, list[Row]]]


def _median(rows: Sequence[Row], value: Callable[[Row], float]) -> float:
    return statistics.median(value(row) for row in rows)


def median_ratio(results: Results, name: str) -> float | None:
    """The median over rounds of each round's e2e-vs-reference ratio."""
    rows, refs = results.get(E2E, {}).get(name, []), results.get(REFERENCE, {}).get(name, [])
    return median_of_ratios([r.measurement for r in rows], [r.measurement for r in refs])


def _per_snippet(rows: Sequence[Row], total: Callable[[Row], float | None]) -> float | None:
    values = [total(row) for row in rows]
    if any(v is None for v in values):
        return None
    return statistics.median(
        (v or 0.0) / row.measurement.n for v, row in zip(values, rows, strict=True)
    )


def print_table(workloads: Sequence[Workload], results: Results) -> None:
    header = (
        f"{'workload':<10}{'executor':<14}{'n':>5}{'wall s':>9}{'snip/s':>9}"
        f"{'p50 ms':>9}{'p95 ms':>9}{'bad':>5}{'x ref':>8}{'redis cmds/snip':>17}"
        f"{'redis us/snip':>15}"
    )
    print(header)
    print("-" * len(header))
    for w in workloads:
        for executor in (REFERENCE, E2E):
            rows = results.get(executor, {}).get(w.name)
            if not rows:
                continue
            ratio = median_ratio(results, w.name) if executor == E2E else None
            ratio_text = "-" if ratio is None else f"{ratio:.2f}x"
            cmds = _per_snippet(rows, lambda row: row.redis_cmds)
            cpu = _per_snippet(rows, lambda row: row.redis_cpu_s)
            cmds_text = "-" if cmds is None else f"{cmds:.2f}"
            cpu_text = "-" if cpu is None else f"{cpu * 1e6:.1f}"
            print(
                f"{w.name:<10}{executor:<14}{rows[0].measurement.n:>5}"
                f"{_median(rows, lambda r: r.measurement.wall_s):>9.2f}"
                f"{_median(rows, lambda r: r.measurement.throughput):>9.1f}"
                f"{_median(rows, lambda r: r.measurement.p50_ms):>9.1f}"
                f"{_median(rows, lambda r: r.measurement.p95_ms):>9.1f}"
                f"{sum(r.measurement.bad for r in rows):>5}{ratio_text:>8}{cmds_text:>17}"
                f"{cpu_text:>15}"
            )
    print(
        "medians of the rounds; x ref: median of the per-round throughput ratios; for 'lone',\n"
        "reference p50 / e2e p50. p50/p95: ExecResult.latency (submit to result, as the\n"
        "caller sees it); for 'lone', wall time around each call (pauses excluded from wall\n"
        "s too). redis us/snip: Redis CPU (INFO cpu, user + sys) per snippet, the worker's\n"
        "idle background included, less what the idle server spends on its own meanwhile\n"
        "(measured before the worker starts); the bench's own INFO calls are left out."
    )


def print_targets(workloads: Sequence[Workload], results: Results) -> None:
    print("\ntargets")
    e2e = results.get(E2E, {})
    for name, need in THROUGHPUT_TARGETS:
        label = f"e2e >= {need:g}x reference on {name}"
        ratio = median_ratio(results, name)
        if ratio is None:
            print(f"  SKIP  {label} (needs both)")
            continue
        print(f"  {'PASS' if ratio >= need else 'FAIL'}  {label}: {ratio:.2f}x")
    label = f"lone e2e p50 <= {LONE_P50_TARGET_MS:g} ms"
    if "lone" in e2e:
        p50 = _median(e2e["lone"], lambda r: r.measurement.p50_ms)
        print(f"  {'PASS' if p50 <= LONE_P50_TARGET_MS else 'FAIL'}  {label}: {p50:.2f} ms")
    else:
        print(f"  SKIP  {label}")
    batched = [w.name for w in workloads if not w.sequential]
    over = "+".join(batched)
    if all(name in e2e for name in batched):
        rows = [row for n in batched for row in e2e[n]]
        n = sum(row.measurement.n for row in rows)
        cmds = sum(row.redis_cmds or 0 for row in rows) / n
        cpu_us = sum(row.redis_cpu_s or 0.0 for row in rows) / n * 1e6
        raw_us = sum(row.redis_raw_cpu_s or 0.0 for row in rows) / n * 1e6
        verdict = "PASS" if cmds <= REDIS_CMDS_PER_SNIPPET_TARGET else "FAIL"
        print(f"  {verdict}  redis cmds/snippet <= {REDIS_CMDS_PER_SNIPPET_TARGET:g} over {over}: "
              f"{cmds:.2f}")  # fmt: skip
        verdict = "PASS" if cpu_us <= REDIS_CPU_US_PER_SNIPPET_TARGET else "FAIL"
        print(
            f"  {verdict}  redis CPU/snippet <= {REDIS_CPU_US_PER_SNIPPET_TARGET:g} us over "
            f"{over}: {cpu_us:.1f} us ({raw_us:.1f} us with the idle server's own), so one "
            f"Redis core serves about {1e6 / cpu_us if cpu_us else math.inf:,.0f} snippets/s"
        )
    else:
        print(f"  SKIP  redis cost per snippet over {over}")


def print_breakdown(workloads: Sequence[Workload], rounds: dict[str, list[Row]]) -> None:
    """Where an e2e snippet's time goes: in the forked child, waiting for a zygote slot, or
    outside the zygote (coalescing, RQ enqueue/dequeue, result write, BLPOP, decode)."""
    rows = {name: runs[-1] for name, runs in rounds.items() if runs}  # the last round
    if not any(row.seen for row in rows.values()):
        return
    print(
        f"\nwhere e2e time goes (ms, p50 over snippets; slots busy = sum(exec) / "
        f"(wall x {WORKER_SLOTS} slots))\n"
        f"{'workload':<10}{'exec':>9}{'slot wait':>11}{'outside':>9}{'latency':>9}"
        f"{'slots busy':>12}"
    )
    for w in workloads:
        row = rows.get(w.name)
        if row is None or not row.seen:
            continue
        seen = row.seen

        def p50_ms(values: list[float]) -> float:
            return nearest_rank(sorted(values), 0.5) * 1000

        outside = [r.latency - r.exec_s - r.queue_s for r in seen]
        busy = sum(r.exec_s for r in seen) / (row.measurement.wall_s * WORKER_SLOTS)
        print(
            f"{w.name:<10}{p50_ms([r.exec_s for r in seen]):>9.1f}"
            f"{p50_ms([r.queue_s for r in seen]):>11.1f}{p50_ms(outside):>9.1f}"
            f"{p50_ms([r.latency for r in seen]):>9.1f}{busy:>11.0%}"
        )


def print_commands(workloads: Sequence[Workload], rounds: dict[str, list[Row]]) -> None:
    """Per e2e workload, what Redis ran per snippet, summed over the rounds: calls and the
    usec Redis timed in each command (a script's usec includes the commands it sent)."""
    print("\nredis commands per snippet (all rounds; usec as INFO commandstats times them)")
    for w in workloads:
        rows = rounds.get(w.name, [])
        n = sum(row.measurement.n for row in rows)
        totals: dict[str, list[int]] = {}
        for row in rows:
            for name, (calls, usec) in (row.per_command or {}).items():
                total = totals.setdefault(name, [0, 0])
                total[0] += calls
                total[1] += usec
        if not n or not totals:
            continue
        print(f"  {w.name}: {'command':<16}{'calls/snip':>11}{'usec/snip':>11}{'usec/call':>11}")
        for name, (calls, usec) in sorted(totals.items(), key=lambda kv: -kv[1][1]):
            print(
                f"  {'':<{len(w.name) + 2}}{name:<16}{calls / n:>11.3f}{usec / n:>11.2f}"
                f"{usec / calls:>11.2f}"
            )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--scale", type=float, default=1.0, help="multiplier on snippet counts (default 1.0)"
    )
    parser.add_argument(
        "--skip-reference", action="store_true", help="codepool only: no ratios, a much shorter run"
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds per workload (default 3)")
    parser.add_argument(
        "--commands", action="store_true", help="also print Redis commands per snippet by command"
    )
    args = parser.parse_args(argv)
    if args.scale <= 0 or args.rounds < 1:
        parser.error("--scale must be > 0 and --rounds >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    workloads = build_workloads(args.scale)
    print(
        f"codepool e2e bench: python {platform.python_version()}, {os.cpu_count()} cpus, "
        f"one worker -c {WORKER_SLOTS} (fork, preload numpy,sympy) on a private "
        f"redis-server, reference=Semaphore(8)+64 threads, scale={args.scale:g}, "
        f"rounds={args.rounds}"
    )
    print_interpreter_startup()
    results: Results = {}
    crashed: list[str] = []
    with ExitStack() as stack:
        # Both sides stay open and each workload runs on them back to back, so a burst of
        # load from elsewhere on the host skews a ratio's two sides alike. The worker idles
        # (blocking dequeues) while the reference runs; the reference holds nothing between.
        sides: dict[str, Callable[[Workload], Row]] = {}
        openers = [(E2E, open_e2e)]
        if not args.skip_reference:
            openers.append((REFERENCE, open_reference))
        for label, opener in openers:
            try:
                sides[label] = stack.enter_context(opener())
            except Exception:
                traceback.print_exc()
                crashed.append(label)
        for label, w, row in alternate(sides, workloads, args.rounds, crashed):
            results.setdefault(label, {}).setdefault(w.name, []).append(row)
        # Printed before the sides close, so a hang or failure on close cannot hide the table.
        print()
        print_table(workloads, results)
        print_breakdown(workloads, results.get(E2E, {}))
        if args.commands:
            print_commands(workloads, results.get(E2E, {}))
        print_targets(workloads, results)
    if crashed:
        print(f"\ncrashed: {', '.join(crashed)}")
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())
