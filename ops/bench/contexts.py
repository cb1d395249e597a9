"""Interpreter contexts, measured side by side in one run: end to end through Redis
(ops/bench/contexts_fleet.py: a trajectory against replay, fork() against a lone
snippet, a reward fan-out against independent snippets, the memory of idle contexts),
then on a local executor.

    python -m codepool.ops.bench.contexts            # both parts
    python -m codepool.ops.bench.contexts --local [--rounds 200]

The local part:

Prints p50/p90 of: a lone snippet's round trip, a context's fork() (to a usable new
context), a call on a context, and the fork/snippet ratio (issue 24 asks for p50 within
2x). fork() is measured twice: again after a fork with no call between (the parent's
spare fork, worker/engine/context_spare.py, serves it) and right after a call on the
parent (the call ended the spare: the fork is made on the order's path).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from codepool.ops.bench import contexts_fleet
from codepool.worker.engine.executor import LocalExecutor


def _quantiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[int(len(ordered) * 0.9)]


def local(rounds: int) -> None:
    with LocalExecutor(concurrency=2, max_contexts=8) as executor:
        snippet_s, fork_s, call_s, cold_s = [], [], [], []
        with executor.context() as parent:
            parent.run_code("import numpy as np\na = np.arange(1000)")
            for _ in range(10):  # warm both paths
                executor.run("print(1)")
                for fork in parent.fork():
                    fork.close()
            for _ in range(rounds):  # interleaved, so both see the same machine
                started = time.perf_counter()
                executor.run("print(1)")
                snippet_s.append(time.perf_counter() - started)
                started = time.perf_counter()
                (fork,) = parent.fork()
                fork_s.append(time.perf_counter() - started)
                started = time.perf_counter()
                fork.run_code("print(a.sum())")
                call_s.append(time.perf_counter() - started)
                fork.close()
                parent.run_code("a[0] = 0")
                started = time.perf_counter()
                (fork,) = parent.fork()
                cold_s.append(time.perf_counter() - started)
                fork.close()
    for name, samples in (
        ("snippet print(1)", snippet_s),
        ("context fork()", fork_s),
        ("fork() after a call", cold_s),
        ("call on the fork", call_s),
    ):
        p50, p90 = _quantiles(samples)
        print(f"{name:<24} p50 {p50 * 1e3:6.2f} ms   p90 {p90 * 1e3:6.2f} ms")
    snippet_p50 = statistics.median(snippet_s)
    print(f"fork p50 / snippet p50: {statistics.median(fork_s) / snippet_p50:.2f}x")
    print(f"fork after a call p50 / snippet p50: {statistics.median(cold_s) / snippet_p50:.2f}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--local", action="store_true", help="only the local executor part")
    parser.add_argument("--rounds", type=int, default=200, help="local fork rounds")
    parser.add_argument("--fleet-rounds", type=int, default=5, help="rounds through Redis")
    args = parser.parse_args()
    code = 0
    if not args.local:
        code = contexts_fleet.main(["--rounds", str(args.fleet_rounds)])
        print()
    local(args.rounds)
    return code


if __name__ == "__main__":
    sys.exit(main())
