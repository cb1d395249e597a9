"""Rewards by fork against one run per test case, side by side in one run: N candidates
x M test cases, as a code-RL reward step checks them.

- baseline: one ``run_code`` per case, the whole program each time (what verl's
  ``sandbox_fusion`` reward sends), all at once;
- run_tests: one harness snippet per candidate (common/reward_tests.py), all at once;

each through ``RemoteSandbox`` (Redis) and through ``codepool serve`` (HTTP:
SandboxFusion's ``/run_code`` against ``/run_tests``), for HumanEval-style assert
tests and APPS-style stdin/stdout tests. The verdicts of both sides must be identical;
the target is run_tests >= 5x faster. Besides wall time it prints the CPU each side
costs per case (this process and its descendants: with the embedded pool, the client,
Redis, the worker, serve and the snippets), which a busy machine distorts less.

    python -m codepool.ops.bench.rewards [--candidates 64] [--tests 20] [-c 2] [--url URL]

Without ``--url`` (or ``REDIS_URL``) it starts a private Redis and a worker (ops/embedded.py),
and a ``codepool serve`` on the same pool.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from typing import Any

import requests

from codepool.common.case_formats import call_cases
from codepool.common.reward_tests import Case, judge, program
from codepool.ops.bench.process_tree import descendants
from codepool.ops.embedded import url_or_embedded
from codepool.ops.serve_command import LISTENING
from codepool.producer import RemoteSandbox

TARGET = 5.0
TIMEOUT_S = 5.0
CLIENTS = 64  # HTTP clients at once (verl's check_correctness uses 32 threads or more)

# HumanEval-style: a typical header, a helper, the function; some candidates are wrong
# (a wrong answer on some cases) or crash on some input.
ASSERT_TASK = '''from typing import List
import math
import re
from collections import Counter


def _norm(xs: List[int]) -> List[int]:
    return [x for x in xs if x is not None]


def solve(xs: List[int], k: int) -> int:
    """The sum of the k largest, plus the gcd of all."""
    xs = _norm(xs)
    {body}
'''
ASSERT_BODIES = [
    "return sum(sorted(xs)[-k:]) + math.gcd(*xs)",  # right
    "return sum(sorted(xs)[:k]) + math.gcd(*xs)",  # wrong
    "return sum(sorted(xs)[-k:]) + math.gcd(*xs) if k < 15 else xs[100]",  # crashes late
    "return sum(sorted(xs, reverse=True)[:k]) + math.gcd(*xs)",  # right, another way
]
CALL_TASK = """class Solution:
    def solve(self, xs: List[int], k: int) -> int:
        xs = [x for x in xs if x is not None]
        {body}
"""
STDIO_TASK = """import sys
from collections import Counter

def main():
    data = sys.stdin.read().split()
    n = int(data[0])
    xs = list(map(int, data[1:1 + n]))
    counts = Counter(xs)
    {body}

main()
"""
STDIO_BODIES = [
    "print(max(counts.values()), sum(xs))",  # right
    "print(max(counts.values()), sum(xs) + (n > 12))",  # wrong on big inputs
    "print(max(counts.values()), sum(xs)) if n < 18 else 1 / 0",  # crashes late
    "print(counts.most_common(1)[0][1], sum(xs))",  # right, another way
]


def _xs(case: int) -> list[int]:
    return [(case * 37 + i * 11) % 23 + 1 for i in range(case + 3)]


# A candidate: (prefix, program, cases); the prefix is what the dataset's harness puts
# before the program (verl's imports for call-based tests).
Work = list[tuple[str, str, list[Case]]]


def assert_workload(candidates: int, tests: int) -> Work:
    work = []
    for c in range(candidates):
        text = ASSERT_TASK.format(body=ASSERT_BODIES[c % len(ASSERT_BODIES)])
        cases = []
        for t in range(tests):
            xs, k = _xs(t), 1 + t % 5
            want = sum(sorted(xs)[-k:]) + math.gcd(*xs)
            cases.append(Case(f"assert solve({xs}, {k}) == {want}"))
        work.append(("", text, cases))
    return work


def stdio_workload(candidates: int, tests: int) -> Work:
    work = []
    for c in range(candidates):
        text = STDIO_TASK.format(body=STDIO_BODIES[c % len(STDIO_BODIES)])
        cases = []
        for t in range(tests):
            xs = _xs(t)
            want = f"{max(Counter(xs).values())} {sum(xs)}"
            stdin = f"{len(xs)}\n{' '.join(map(str, xs))}\n"
            cases.append(Case(stdin=stdin, expected_stdout=want))
        work.append(("", text, cases))
    return work


def call_workload(candidates: int, tests: int) -> Work:
    """LeetCode-style call-based tests in verl's format (``fn_name``): the programs
    verl's sandbox_fusion reward sends, its imports before the candidate."""
    work = []
    for c in range(candidates):
        body = ASSERT_BODIES[c % len(ASSERT_BODIES)].replace("xs[100]", "xs[k * 100]")
        text = CALL_TASK.format(body=body)
        inputs, outputs = [], []
        for t in range(tests):
            xs, k = _xs(t), 1 + t % 5
            inputs.append(f"{json.dumps(xs)}\n{k}")
            outputs.append(str(sum(sorted(xs)[-k:]) + math.gcd(*xs)))
        prefix, cases = call_cases("solve", inputs, outputs)
        work.append((prefix, text, cases))
    return work


# -- the four ways ------------------------------------------------------------------------


def _per_candidate(work: Work, flat: list[str]) -> list[list[str]]:
    verdicts, at = [], 0
    for _, _, cases in work:
        verdicts.append(flat[at : at + len(cases)])
        at += len(cases)
    return verdicts


def sandbox_baseline(sandbox: RemoteSandbox, work: Work) -> list[list[str]]:
    async def all_cases() -> list[list[str]]:
        pairs = [(prefix, text, case) for prefix, text, cases in work for case in cases]
        results = await asyncio.gather(
            *(
                sandbox.arun_code(
                    program(text, case, prefix), stdin=case.stdin, timeout_s=TIMEOUT_S
                )
                for prefix, text, case in pairs
            )
        )
        flat = [judge(case, result) for (_, _, case), result in zip(pairs, results, strict=True)]
        return _per_candidate(work, flat)

    return asyncio.run(all_cases())


def sandbox_forked(sandbox: RemoteSandbox, work: Work) -> list[list[str]]:
    async def all_candidates() -> list[list[str]]:
        results = await asyncio.gather(
            *(
                sandbox.arun_tests(text, cases, prefix=prefix, timeout_s=TIMEOUT_S)
                for prefix, text, cases in work
            )
        )
        return [[r.verdict for r in one] for one in results]

    return asyncio.run(all_candidates())


def _sandbox_fusion_verdict(case: Case, answer: dict[str, Any]) -> str:
    """The verdict verl's check_correctness gives a /run_code answer (as judge does)."""
    run = answer.get("run_result") or {}
    if answer.get("status") == "Success" and run.get("status") == "Finished":
        if case.expected_stdout is None:
            return "passed"
        same = (run.get("stdout") or "").rstrip("\n") == case.expected_stdout.rstrip("\n")
        return "passed" if same else "wrong_answer"
    if run.get("status") == "TimeLimitExceeded":
        return "timeout"
    return "error" if run else "not_run"


def _session() -> requests.Session:
    session = requests.Session()
    session.mount("http://", requests.adapters.HTTPAdapter(pool_maxsize=CLIENTS))
    return session


def post(session: requests.Session, url: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST as verl's clients do: a 503/504 (busy) is retried after its Retry-After."""
    while True:
        answer = session.post(url, json=body, timeout=300)
        if answer.status_code not in (503, 504):
            result: dict[str, Any] = answer.json()
            return result
        time.sleep(float(answer.headers.get("retry-after", "1")))


def serve_baseline(url: str, work: Work) -> list[list[str]]:
    session = _session()

    def one(item: tuple[str, str, Case]) -> str:
        prefix, text, case = item
        body = {
            "code": program(text, case, prefix),
            "stdin": case.stdin,
            "language": "python",
            "run_timeout": TIMEOUT_S,
        }
        return _sandbox_fusion_verdict(case, post(session, f"{url}/run_code", body))

    items = [(prefix, text, case) for prefix, text, cases in work for case in cases]
    with ThreadPoolExecutor(CLIENTS) as pool:
        return _per_candidate(work, list(pool.map(one, items)))


def serve_forked(url: str, work: Work) -> list[list[str]]:
    session = _session()

    def one(item: tuple[str, str, list[Case]]) -> list[str]:
        prefix, text, cases = item
        body = {
            "candidate": text,
            "prefix": prefix,
            "cases": [
                {"code": c.code, "stdin": c.stdin, "expected_stdout": c.expected_stdout}
                for c in cases
            ],
            "timeout_s": TIMEOUT_S,
        }
        return [r["verdict"] for r in post(session, f"{url}/run_tests", body)["results"]]

    with ThreadPoolExecutor(CLIENTS) as pool:
        return list(pool.map(one, work))


# -- the run ------------------------------------------------------------------------------


def tree_cpu_s() -> float:
    """CPU seconds used so far by this process and its descendants (with an embedded
    pool: the client, Redis, the worker, serve and every snippet they reaped)."""
    total = 0
    for pid in [os.getpid(), *descendants(os.getpid())]:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return total / os.sysconf("SC_CLK_TCK")


def timed(run: Callable[[], list[list[str]]]) -> tuple[float, float, list[list[str]]]:
    """Wall seconds, CPU seconds (tree_cpu_s) and the verdicts of ``run``."""
    cpu_s, started = tree_cpu_s(), time.perf_counter()
    verdicts = run()
    return time.perf_counter() - started, tree_cpu_s() - cpu_s, verdicts


def start_serve(url: str) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "codepool.ops.cli", "serve", "--port", "0", "--url", url],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    assert process.stdout is not None
    for line in process.stdout:
        match = LISTENING.search(line)
        if match:
            return process, match.group(1)
    raise SystemExit(f"codepool serve exited with {process.wait()}")


Way = Callable[[Work], list[list[str]]]


Row = tuple[float, float, float, float, float]


def measure(baseline: Way, forked: Way, work: Work, rounds: int) -> Row:
    """Median wall and CPU seconds of each (alternated, so both see the same machine),
    and whether every round's verdicts were the same (1.0) or not (0.0)."""
    base_s, fork_s, base_cpu, fork_cpu, same = [], [], [], [], True
    for _ in range(rounds):
        took, cpu_s, base_verdicts = timed(lambda: baseline(work))
        base_s.append(took)
        base_cpu.append(cpu_s)
        took, cpu_s, fork_verdicts = timed(lambda: forked(work))
        fork_s.append(took)
        fork_cpu.append(cpu_s)
        same = same and base_verdicts == fork_verdicts
    median = statistics.median
    return median(base_s), median(fork_s), median(base_cpu), median(fork_cpu), float(same)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--candidates", type=int, default=64)
    parser.add_argument("--tests", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=1, help="rounds per pair (median)")
    parser.add_argument("-c", "--concurrency", type=int, default=2, help="embedded slots")
    parser.add_argument("--url", default=None, help="a pool's Redis (default: embedded)")
    args = parser.parse_args(argv)
    rows: list[tuple[str, str, Row]] = []
    with ExitStack() as stack:
        url = url_or_embedded(stack, args.url, args.concurrency)
        sandbox = stack.enter_context(RemoteSandbox(url, timeout=TIMEOUT_S))
        serve, serve_url = start_serve(url)
        stack.callback(serve.wait, 30)
        stack.callback(serve.terminate)
        load = os.getloadavg()[0]
        print(f"{args.candidates} candidates x {args.tests} tests; load average {load:.2f}")
        workloads = {
            "assert": assert_workload(args.candidates, args.tests),
            "stdio": stdio_workload(args.candidates, args.tests),
            "call": call_workload(args.candidates, args.tests),
        }
        sandbox_forked(sandbox, workloads["assert"][:2])  # warm both paths
        sandbox_baseline(sandbox, workloads["assert"][:2])
        ways: list[tuple[str, Way, Way]] = [
            (
                "RemoteSandbox",
                lambda w: sandbox_baseline(sandbox, w),
                lambda w: sandbox_forked(sandbox, w),
            ),
            ("serve", lambda w: serve_baseline(serve_url, w), lambda w: serve_forked(serve_url, w)),
        ]
        for name, work in workloads.items():
            for path, baseline, forked in ways:
                rows.append((name, path, measure(baseline, forked, work, args.rounds)))
        load = os.getloadavg()[0]
    print(f"\nload average at the end {load:.2f}")
    cases = args.candidates * args.tests
    print(
        f"{'tests':<7} {'path':<14} {'per case s':>10} {'run_tests s':>11} {'speedup':>8}"
        f" {'CPU ms/case':>12} {'run_tests':>10} {'CPU ratio':>9}  verdicts"
    )
    met = True
    for name, path, (base_s, fork_s, base_cpu, fork_cpu, same) in rows:
        ratio = base_s / fork_s
        met = met and bool(same) and ratio >= TARGET
        verdicts = "same" if same else "DIFFER"
        print(
            f"{name:<7} {path:<14} {base_s:>10.2f} {fork_s:>11.2f} {ratio:>7.1f}x"
            f" {base_cpu / cases * 1e3:>12.2f} {fork_cpu / cases * 1e3:>10.2f}"
            f" {base_cpu / max(fork_cpu, 1e-9):>8.1f}x  {verdicts}"
        )
    print(
        f"target: run_tests >= {TARGET:.0f}x with the same verdicts: {'met' if met else 'NOT met'}"
    )
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
