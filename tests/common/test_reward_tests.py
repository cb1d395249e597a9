"""Rewards by fork (common/reward_tests.py, common/fork_harness.py) on real executors:
every case gets the verdict one plain run of its whole program gets, a case that
crashes, hangs, exits or kills its parent is its own verdict alone, and a program that
cannot be shared runs plain."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from codepool.common.errors import ConfigError
from codepool.common.result import ExecResult
from codepool.common.reward_tests import (
    ERROR,
    PASSED,
    TIMEOUT,
    WRONG_ANSWER,
    Case,
    judge,
    program,
    run_tests,
)
from codepool.worker import LocalExecutor
from tests.conftest import NO_NAMESPACES, executor_on

CANDIDATE = "import math\nprint('loaded')\nCACHE = {}\ndef add(a, b):\n    return a + b\n"
# Each with the verdict a plain run gives (checked against one in the test).
CASES = [
    Case("assert add(1, 2) == 3"),
    Case("assert add(1, 2) == 4"),
    Case("print(add(2, 2))", expected_stdout="loaded\n4"),
    Case("print(add(2, 2))", expected_stdout="loaded\n5"),
    Case("print(input()[::-1])", stdin="abc\n", expected_stdout="loaded\ncba"),
    Case("while True: pass"),
    Case("import os; os._exit(3)"),
    Case("import sys; sys.exit('bye')"),
    Case("raise SystemExit(0)"),
    Case("1 / 0"),
    Case("x = ("),  # does not compile: runs plain, as the whole program fails
    Case("from __future__ import annotations\nassert add(1, 1) == 2"),
    Case("CACHE['x'] = 1\nassert len(CACHE) == 1"),  # state from an earlier case: none
    Case("import subprocess\nsubprocess.Popen(['sleep', '30'])\nprint('left one')"),
    Case("import os; os.kill(os.getppid(), 9)\nprint('after')"),  # the template, forked
    Case("assert math.gcd(12, 18) == 6"),
]


@pytest.fixture(scope="module", params=["fork", "spawn", NO_NAMESPACES])
def executor(request: pytest.FixtureRequest) -> Iterator[LocalExecutor]:
    with executor_on(request.param) as ex:
        yield ex


def plain_runs(
    executor: LocalExecutor, candidate: str, cases: list[Case], **kw: float
) -> list[ExecResult]:
    return [executor.run(program(candidate, case), stdin=case.stdin, **kw) for case in cases]


def plain_verdicts(
    executor: LocalExecutor, candidate: str, cases: list[Case], **kw: float
) -> list[str]:
    return [
        judge(case, run)
        for case, run in zip(cases, plain_runs(executor, candidate, cases, **kw), strict=True)
    ]


def test_verdicts_are_those_of_one_plain_run_per_case(executor: LocalExecutor) -> None:
    results = run_tests(executor.run, CANDIDATE, CASES, timeout_s=2.0)
    plain = plain_runs(executor, CANDIDATE, CASES, timeout_s=2.0)
    assert [r.verdict for r in results] == [judge(c, p) for c, p in zip(CASES, plain, strict=True)]
    assert results[0].verdict == PASSED and results[1].verdict == ERROR
    assert results[3].verdict == WRONG_ANSWER and results[5].verdict == TIMEOUT
    assert results[6].result.returncode == 3 and "bye" in results[7].result.stderr
    for index in (1, 9, 10):  # tracebacks with the whole program's line numbers
        assert results[index].result.stderr == plain[index].stderr
    assert results[4].result.stdout == "loaded\ncba\n"  # the load's output, then the case's
    forked = [r.forked for r in results]
    assert forked[:10] == [True] * 10
    assert not forked[10] and not forked[11]  # these ran plain


def test_a_program_that_reads_stdin_runs_plain(executor: LocalExecutor) -> None:
    candidate = "n = int(input())\nprint(n * 2)\n"
    cases = [Case(stdin=f"{n}\n", expected_stdout=str(n * 2 + (n == 3))) for n in range(5)]
    results = run_tests(executor.run, candidate, cases, timeout_s=2.0)
    assert [r.verdict for r in results] == [PASSED] * 3 + [WRONG_ANSWER] + [PASSED]
    assert [r.verdict for r in results] == plain_verdicts(executor, candidate, cases, timeout_s=2.0)
    assert not any(r.forked for r in results)


def test_a_load_that_fails_fails_every_case_as_a_plain_run_does(executor: LocalExecutor) -> None:
    for candidate in ("import no_such_module_here\n", "def f(:\n", "while True: pass\n"):
        cases = [Case("print(1)", expected_stdout="1"), Case("")]
        results = run_tests(executor.run, candidate, cases, timeout_s=1.0)
        assert [r.verdict for r in results] == plain_verdicts(
            executor, candidate, cases, timeout_s=1.0
        )
        assert results[0].verdict != PASSED


def test_cases_past_a_round_go_in_the_next_one(executor: LocalExecutor) -> None:
    cases = [Case("import time; time.sleep(60)")] * 6 + [
        Case("print(add(1, 1))", expected_stdout="loaded\n2")
    ]
    calls = []

    def counted(snippet: object, **limits: float) -> object:
        calls.append(limits["timeout_s"])
        return executor.run(snippet, **limits)

    started = time.monotonic()
    results = run_tests(counted, CANDIDATE, cases, timeout_s=0.5, max_round_s=3.0)
    assert [r.verdict for r in results] == [TIMEOUT] * 6 + [PASSED]
    assert len(calls) > 1 and max(calls) == 3.0
    assert time.monotonic() - started < 60  # nobody waited for a sleeper


def test_output_is_cut_as_a_run_cuts_it(executor: LocalExecutor) -> None:
    (result,) = run_tests(
        executor.run, CANDIDATE, [Case("print('x' * 10000)")], max_output_chars=100
    )
    assert result.result.truncated
    assert result.result.stdout.startswith("[... truncated ")
    assert result.result.stdout.endswith("x" * 99 + "\n")


def test_bad_input_is_a_clear_error() -> None:
    with pytest.raises(ConfigError):
        run_tests(lambda *a, **k: None, 42, [Case()])  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        run_tests(lambda *a, **k: None, "", [Case(stdin=3)])  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        run_tests(lambda *a, **k: None, "", ["assert 1"])  # type: ignore[list-item]
    with pytest.raises(ConfigError):
        run_tests(lambda *a, **k: None, "", [Case()], timeout_s=float("nan"))
