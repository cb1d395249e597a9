"""Interpreter contexts end to end through Redis, against what the field does without
them, each pair measured side by side in one run on one real worker host:

- a trajectory of T turns (each defines a function or data and uses the earlier ones)
  in a context, against the replay pattern (each call a fresh snippet that runs the
  whole history again), for T in 5, 10, 20;
- ``fork()`` of a context that imported numpy against a lone snippet, p50;
- a reward-style fan-out: a candidate solution defined once and 20 test cases run in
  forks of it, against 20 independent snippets (solution + one test each), with their
  verdicts compared;
- memory: the private memory of 100 idle small contexts on one host, per context (read
  from /proc on the host: the bench runs the worker itself).

    python -m codepool.ops.bench.contexts_fleet [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import redis

from codepool.common import rq_records
from codepool.ops.bench.e2e import stop_worker
from codepool.ops.redis_server import RedisServer
from codepool.producer import RemoteSandbox
from codepool.worker.engine.executor import LocalExecutor

# About 60 ms of CPU a turn here: a model-written turn that computes something (a
# sympy solve, a numpy fit) costs that or more; the context saves what replay re-runs.
TURN_WORK = "sorted((i * 7919) % 10007 for i in range(500000))"
TARGET_TRAJECTORY = 5.0  # at 10 turns
TARGET_FORK = 2.0


def turn(i: int) -> str:
    """Turn i: data and a function of its own, using every earlier turn's."""
    uses = f"f{i - 1}(x) + " if i else ""
    return (
        f"data{i} = {TURN_WORK}\n"
        f"def f{i}(x):\n    return {uses}data{i}[x % len(data{i})]\n"
        f"print(f{i}({i}))"
    )


@contextmanager
def worker_host(url: str) -> Iterator[None]:
    workdir = tempfile.mkdtemp(prefix="codepool-ctx-bench-")
    command = [sys.executable, "-m", "codepool.ops.cli", "worker", "--url", url, "-c", "2"]
    command += ["--preload", "numpy", "--max-contexts", "256", "--name", "bench"]
    with open(os.path.join(workdir, "worker.log"), "wb") as log:
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "TMPDIR": workdir},
            start_new_session=True,
        )
    try:
        client = redis.Redis.from_url(url)
        deadline = time.monotonic() + 60
        while client.scard(rq_records.workers_key()) < 2:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"worker not ready; see {workdir}/worker.log")
            time.sleep(0.1)
        client.close()
        yield
    finally:
        stop_worker(process)
        shutil.rmtree(workdir, ignore_errors=True)


def timed(run: Callable[[], object]) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def trajectory(sandbox: RemoteSandbox, turns: int, rounds: int) -> tuple[float, float]:
    """Median seconds of a whole trajectory: in a context, and by replay."""

    def in_context() -> None:
        with sandbox.context() as ctx:
            for i in range(turns):
                result = ctx.run_code(turn(i))
                assert result.ok, result

    def by_replay() -> None:
        for i in range(turns):
            history = "\n".join(turn(j) for j in range(i + 1))
            result = sandbox.run_code(history)
            assert result.ok, result

    ctx_s, replay_s = [], []
    for _ in range(rounds):
        ctx_s.append(timed(in_context))
        replay_s.append(timed(by_replay))
    return statistics.median(ctx_s), statistics.median(replay_s)


def fork_against_snippet(sandbox: RemoteSandbox, rounds: int) -> tuple[float, float]:
    """p50 seconds: a fork() of a numpy context, and a lone snippet, interleaved."""
    fork_s, snippet_s = [], []
    with sandbox.context() as parent:
        assert parent.run_code("import numpy as np\na = np.arange(1000)").ok
        for _ in range(rounds):
            snippet_s.append(timed(lambda: sandbox.run_code("print(1)")))
            started = time.perf_counter()
            (fork,) = parent.fork()
            fork_s.append(time.perf_counter() - started)
            fork.close()
    return statistics.median(fork_s), statistics.median(snippet_s)


SOLUTION = (
    "import math\n"
    "PRIMES = [p for p in range(2, 200000) if all(p % d for d in range(2, math.isqrt(p) + 1))]\n"
    "def solve(n):\n    return sum(1 for p in PRIMES if p <= n)\n"
)
CASES = [(n, None) for n in range(1000, 21000, 1000)]


def fan_out(sandbox: RemoteSandbox) -> tuple[float, float, bool]:
    """Seconds for 20 test cases: forks of a context holding the solution, and 20
    independent snippets; and whether their verdicts are the same."""
    tests = [f"print(solve({n}))" for n, _ in CASES]

    def with_forks() -> list[str]:
        with sandbox.context() as ctx:
            assert ctx.run_code(SOLUTION).ok
            forks = ctx.fork(len(tests))
            outs = [fork.run_code(test).stdout for fork, test in zip(forks, tests, strict=True)]
            for fork in forks:
                fork.close()
            return outs

    def independent() -> list[str]:
        futures = [sandbox.submit(SOLUTION + test) for test in tests]
        return [future.result().stdout for future in futures]

    started = time.perf_counter()
    forked = with_forks()
    forks_s = time.perf_counter() - started
    started = time.perf_counter()
    alone = independent()
    alone_s = time.perf_counter() - started
    return forks_s, alone_s, forked == alone


def idle_memory_kb(count: int) -> float:
    """Private memory (kB) per idle small context, of ``count`` on one executor."""
    with LocalExecutor(concurrency=2, max_contexts=count + 8, preload=("numpy",)) as executor:
        contexts = [executor.context() for _ in range(count)]
        try:
            for ctx in contexts:
                assert ctx.run_code("x = 1").ok
            total = sum(_private_kb(ctx.pid) for ctx in contexts)
        finally:
            for ctx in contexts:
                ctx.close()
    return total / count


def _private_kb(pid: int) -> int:
    total = 0
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                total += int(line.split()[1])
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    ok = True
    with RedisServer() as server, worker_host(server.url):
        with RemoteSandbox(server.url, timeout=30) as sandbox:
            sandbox.run_code("print(1)")  # warm
            print("trajectory end to end through Redis (median of rounds)")
            print(f"{'turns':>6}{'context s':>11}{'replay s':>10}{'replay / context':>18}")
            ratios = {}
            for turns in (5, 10, 20):
                ctx_s, replay_s = trajectory(sandbox, turns, args.rounds)
                ratios[turns] = replay_s / ctx_s
                print(f"{turns:>6}{ctx_s:>11.3f}{replay_s:>10.3f}{ratios[turns]:>17.2f}x")
            fork_s, snippet_s = fork_against_snippet(sandbox, 20 * args.rounds)
            print(
                f"\nfork() of a numpy context p50 {fork_s * 1e3:.2f} ms, lone snippet p50 "
                f"{snippet_s * 1e3:.2f} ms: {fork_s / snippet_s:.2f}x"
            )
            forks_s, alone_s, same = fan_out(sandbox)
            print(
                f"reward fan-out, 20 tests: forks {forks_s:.3f} s, independent snippets "
                f"{alone_s:.3f} s ({alone_s / forks_s:.2f}x), same verdicts: {same}"
            )
    per_kb = idle_memory_kb(100)
    print(f"memory: 100 idle small contexts, private memory {per_kb / 1024:.2f} MiB each")
    checks = [
        (ratios[10] >= TARGET_TRAJECTORY, f"10 turns {ratios[10]:.2f}x >= {TARGET_TRAJECTORY}x"),
        (ratios[20] > ratios[10] > ratios[5], "the ratio grows with turns"),
        (fork_s / snippet_s <= TARGET_FORK, f"fork p50 {fork_s / snippet_s:.2f}x <= 2x"),
        (forks_s < alone_s and same, "fan-out faster, same verdicts"),
    ]
    for good, what in checks:
        ok &= good
        print(f"{'PASS' if good else 'FAIL'} {what}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
