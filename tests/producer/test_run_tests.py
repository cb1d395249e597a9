"""RemoteSandbox.run_tests through Redis and a real worker: one harness snippet per
candidate, the verdicts of one run_code per case, sync and async (concurrent
candidates share batches)."""

from __future__ import annotations

import asyncio

from codepool.common.reward_tests import ERROR, PASSED, TIMEOUT, WRONG_ANSWER, Case, judge, program
from codepool.producer import RemoteSandbox
from tests.conftest import StartWorker

CANDIDATES = [
    "def solve(xs):\n    return sorted(xs)\n",
    "def solve(xs):\n    return xs\n",
    "def solve(xs):\n    while True:\n        pass\n",
]
CASES = [
    Case("assert solve([3, 1, 2]) == [1, 2, 3]"),
    Case("assert solve([]) == []"),
    Case("print(solve([2, 1]))", expected_stdout="[1, 2]"),
]
STDIO = "a, b = map(int, input().split())\nprint(a + b)\n"


def test_run_tests_gives_the_verdicts_of_run_code(
    redis_url: str, start_worker: StartWorker
) -> None:
    start_worker()
    with RemoteSandbox(redis_url, timeout=10) as sandbox:
        for candidate in CANDIDATES:
            results = sandbox.run_tests(candidate, CASES, timeout_s=1.0)
            plain = [
                judge(case, sandbox.run_code(program(candidate, case), timeout_s=1.0))
                for case in CASES
            ]
            assert [r.verdict for r in results] == plain
        assert [r.verdict for r in sandbox.run_tests(CANDIDATES[1], CASES, timeout_s=1.0)] == [
            ERROR,
            PASSED,
            WRONG_ANSWER,
        ]
        stdio = [Case(stdin="1 2\n", expected_stdout="3"), Case(stdin="2 2\n", expected_stdout="5")]
        results = sandbox.run_tests(STDIO, stdio)
        assert [r.verdict for r in results] == [PASSED, WRONG_ANSWER]


def test_arun_tests_runs_candidates_side_by_side(redis_url: str, start_worker: StartWorker) -> None:
    start_worker()
    with RemoteSandbox(redis_url, timeout=10) as sandbox:

        async def all_of_them() -> list[list[str]]:
            runs = [sandbox.arun_tests(c, CASES, timeout_s=1.0) for c in CANDIDATES]
            return [[r.verdict for r in results] for results in await asyncio.gather(*runs)]

        assert asyncio.run(all_of_them()) == [
            [PASSED] * 3,
            [ERROR, PASSED, WRONG_ANSWER],
            [TIMEOUT] * 3,
        ]
