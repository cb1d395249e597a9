"""Rewards by fork: run a candidate program against test cases, loading it once.

``run_tests(run, candidate, cases)`` gives each case the verdict one plain run of
``prefix + candidate + "\\n\\n" + case.code`` (stdin: ``case.stdin``) would get, as
one ``run_code`` per case gives it, but it sends one snippet, the fork harness
(common/fork_harness.py): the candidate is loaded once and every case runs in a
copy-on-write fork of it, each with its own wall clock, output and exit. A case that
crashes, hangs, exits or kills its parent is that case's verdict alone. A program that
cannot be shared (it reads stdin, fails or hangs while it loads, or patches what the
harness needs) runs plain, case by case, inside the same snippet.

``run`` is any ``run_code``: ``RemoteSandbox.run_code``, ``LocalExecutor.run``, or
anything that takes ``(Snippet, **limits)`` and gives an ExecResult. Portable (the
trainer's side imports it; only the snippet needs Linux).
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from codepool.common import fork_harness, harness_procs
from codepool.common.errors import ConfigError
from codepool.common.observation import decode_tail
from codepool.common.result import ExecResult, infra
from codepool.common.snippet import Snippet

# Verdicts, in the terms of SandboxFusion's clients (verl's check_correctness): passed,
# ran and printed something else, exited non-zero (or was killed), ran out of time, and
# never ran (a fault of codepool's, not the program's).
PASSED, WRONG_ANSWER, ERROR, TIMEOUT, NOT_RUN = (
    "passed",
    "wrong_answer",
    "error",
    "timeout",
    "not_run",
)
DEFAULT_TIMEOUT_S = 10.0
# The harness snippet's own timeout: enough for every case at its full timeout, within
# this ceiling (a worker's default maximum), never below two cases' worth; cases it had
# no time for go out in another snippet.
MAX_ROUND_S = 30.0
ROUND_MARGIN_S = 2.0


def _harness_source() -> str:
    """The harness snippet: harness_procs.py's source, then fork_harness.py's without
    its import of it (or its own ``__future__`` import)."""
    procs = Path(harness_procs.__file__).read_text(encoding="utf-8")
    main = Path(fork_harness.__file__).read_text(encoding="utf-8")
    start = main.index("from codepool.common.harness_procs import (")
    end = main.index(")\n", start) + 2
    main = (main[:start] + main[end:]).replace("from __future__ import annotations\n", "", 1)
    return procs + "\n\n" + main


HARNESS_SOURCE = _harness_source()

Run = Callable[..., ExecResult]
ARun = Callable[..., Awaitable[ExecResult]]


@dataclass(frozen=True, slots=True)
class Case:
    """One test case. code: run after the candidate, as if appended to it (assert
    statements, a call; "" for a stdin/stdout test). stdin: fed to the program (None:
    at EOF at once). expected_stdout: what it must print, compared with trailing
    newlines stripped (None: exiting 0 passes)."""

    code: str = ""
    stdin: str | None = None
    expected_stdout: str | None = None


@dataclass(frozen=True, slots=True)
class CaseResult:
    """A case's verdict (PASSED, WRONG_ANSWER, ERROR, TIMEOUT or NOT_RUN) and the
    observation of its run. forked: whether it ran in a fork of the loaded candidate
    (else it ran as a plain, whole program)."""

    verdict: str
    result: ExecResult
    forked: bool = False

    @property
    def passed(self) -> bool:
        return self.verdict == PASSED


def judge(case: Case, result: ExecResult) -> str:
    """The verdict of ``result`` for ``case``: SandboxFusion's rules (exit 0 and, when an
    output is expected, the same stdout up to trailing newlines)."""
    if result.status in ("infra", "rejected", "cancelled"):
        return NOT_RUN
    if result.timed_out:
        return TIMEOUT
    if not result.ok:
        return ERROR
    if case.expected_stdout is None:
        return PASSED
    same = result.stdout.rstrip("\n") == case.expected_stdout.rstrip("\n")
    return PASSED if same else WRONG_ANSWER


def program(candidate: str, case: Case, prefix: str = "") -> str:
    """The whole program a plain run of ``case`` runs."""
    return prefix + candidate + "\n\n" + case.code


@dataclass
class TestPlan:
    """The state of one ``run_tests``: what is left, what each round sends, and the
    results so far. Drive it with ``next_call`` / ``take`` (sync and async alike)."""

    __test__ = False  # not a pytest class

    candidate: str
    cases: list[Case]
    prefix: str = ""
    timeout_s: float = DEFAULT_TIMEOUT_S
    fork: bool = True
    limits: dict[str, Any] = field(default_factory=dict)
    max_round_s: float = MAX_ROUND_S
    results: dict[int, CaseResult] = field(default_factory=dict)
    _sent: list[int] = field(default_factory=list)
    _plain: bool = False  # a round made no progress: the rest go one run_code each

    def __post_init__(self) -> None:
        if not isinstance(self.candidate, str) or not isinstance(self.prefix, str):
            raise ConfigError("the candidate and prefix must be str")
        for case in self.cases:
            if not isinstance(case, Case):
                raise ConfigError(f"cases must be Case, got {type(case).__name__}")
            if not isinstance(case.code, str) or not isinstance(case.stdin, (str, type(None))):
                raise ConfigError("a Case's code must be str and its stdin str or None")
        if not (isinstance(self.timeout_s, (int, float)) and math.isfinite(self.timeout_s)):
            raise ConfigError("timeout_s must be a finite number")
        if self.timeout_s <= 0:
            raise ConfigError("timeout_s must be positive")

    def left(self) -> list[int]:
        return [index for index in range(len(self.cases)) if index not in self.results]

    def next_calls(self) -> list[tuple[Snippet, dict[str, Any]]]:
        """What to run next (one harness snippet, or one plain run per case left once
        the harness cannot help); empty when every case has its result."""
        left = self.left()
        self._sent = left
        if not left:
            return []
        output = {"max_output_chars": self.limits.get("max_output_chars", 4096)}
        if self._plain:
            return [
                (
                    Snippet.make(
                        program(self.candidate, self.cases[i], self.prefix),
                        stdin=self.cases[i].stdin,
                    ),
                    {**self.limits, "timeout_s": self.timeout_s},
                )
                for i in left
            ]
        round_s = min(
            max(self.max_round_s, 2 * self.timeout_s + ROUND_MARGIN_S),
            (len(left) + 1) * self.timeout_s + ROUND_MARGIN_S,
        )
        spec = {
            "prefix": self.prefix,
            "candidate": self.candidate,
            "cases": [{"code": self.cases[i].code, "stdin": self.cases[i].stdin} for i in left],
            "timeout_s": self.timeout_s,
            "budget_s": round_s,
            "fork": self.fork,
            **output,
        }
        snippet = Snippet.make(
            HARNESS_SOURCE
            + _routing_hint(self.prefix + self.candidate, [self.cases[i] for i in left]),
            files={fork_harness.SPEC_PATH: json.dumps(spec)},
            fetch_files=[fork_harness.RESULTS_PATH],
        )
        # Room on its stdout for a digest line per case.
        digests = max(int(self.limits.get("max_output_chars", 4096)), 64 * len(left) + 256)
        return [(snippet, {**self.limits, "timeout_s": round_s, "max_output_chars": digests})]

    def take(self, results: Sequence[ExecResult]) -> None:
        """The results of the calls ``next_calls`` gave, in order."""
        if self._plain:
            for index, result in zip(self._sent, results, strict=True):
                self.results[index] = CaseResult(judge(self.cases[index], result), result)
            return
        (harness,) = results
        got = 0
        for line in _result_lines(harness):
            position = line.get("i")
            if not isinstance(position, int) or not 0 <= position < len(self._sent):
                continue
            index = self._sent[position]
            result = _case_result(line, harness, int(self.limits.get("max_output_chars", 4096)))
            forked = line.get("mode") == "fork"
            self.results[index] = CaseResult(judge(self.cases[index], result), result, forked)
            got += 1
        if got == 0:
            if harness.status in ("rejected", "cancelled"):
                for index in self._sent:  # the same input would be refused case by case
                    self.results[index] = CaseResult(NOT_RUN, harness)
            else:
                self._plain = True

    def ordered(self) -> list[CaseResult]:
        missing = infra("codepool: the case has no result")
        return [self.results.get(i, CaseResult(NOT_RUN, missing)) for i in range(len(self.cases))]


def run_tests(
    run: Run,
    candidate: str,
    cases: Sequence[Case],
    *,
    prefix: str = "",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    fork: bool = True,
    max_round_s: float = MAX_ROUND_S,
    **limits: Any,
) -> list[CaseResult]:
    """Each case's verdict and observation, in order (see the module docstring).

    run: a ``run_code`` (``RemoteSandbox.run_code``, ``LocalExecutor.run``).
    timeout_s: wall clock per case, seconds. fork: False runs every case plain (one
    snippet still). max_round_s: the longest a harness snippet is asked to run (more
    cases than fit go in the next one; see MAX_ROUND_S). Other keywords: Limits fields
    for every case (``memory_mb``...).
    """
    plan = TestPlan(candidate, list(cases), prefix, timeout_s, fork, dict(limits), max_round_s)
    while calls := plan.next_calls():
        plan.take([run(snippet, **call_limits) for snippet, call_limits in calls])
    return plan.ordered()


async def arun_tests(
    arun: ARun,
    candidate: str,
    cases: Sequence[Case],
    *,
    prefix: str = "",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    fork: bool = True,
    max_round_s: float = MAX_ROUND_S,
    **limits: Any,
) -> list[CaseResult]:
    """``run_tests`` for async callers: ``arun`` is an ``arun_code``."""
    import asyncio

    plan = TestPlan(candidate, list(cases), prefix, timeout_s, fork, dict(limits), max_round_s)
    while calls := plan.next_calls():
        plan.take(await asyncio.gather(*(arun(snippet, **lim) for snippet, lim in calls)))
    return plan.ordered()


def _routing_hint(source: str, cases: list[Case]) -> str:
    """Unreachable imports naming what the programs import, so the worker routes the
    harness to a zygote that has them preloaded (worker/engine/routing.py scans the
    snippet's own imports)."""
    import ast

    names: set[str] = set()
    for text in [source, *(case.code for case in cases)]:
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    names = {name for name in names if name.isidentifier()}
    if not names:
        return ""
    return "\nif 0:  # routing: what the programs import\n" + "".join(
        f"    import {name}\n" for name in sorted(names)
    )


def _result_lines(harness: ExecResult) -> list[dict[str, Any]]:
    """The harness's result lines that its own stdout vouches for (a digest of each):
    a line written by anything else in the sandbox is not taken (its case runs again)."""
    vouched: dict[int, str] = {}
    for said in harness.stdout.splitlines():
        words = said.split()
        if len(words) == 3 and words[0] == harness_procs.DIGEST_TAG.decode() and words[1].isdigit():
            vouched[int(words[1])] = words[2]
    data = harness.files.get(fork_harness.RESULTS_PATH, b"")
    lines = []
    for raw in data.splitlines(keepends=True):
        try:
            line = json.loads(raw)
        except ValueError:
            continue  # a line cut by the harness's own end
        if not isinstance(line, dict) or not isinstance(line.get("i"), int):
            continue
        if vouched.get(line["i"]) == harness_procs.digest(raw):
            lines.append(line)
    return lines


def _case_result(line: dict[str, Any], harness: ExecResult, max_chars: int) -> ExecResult:
    def text(name: str) -> tuple[str, bool]:
        raw = str(line.get(name, "")).encode("latin-1", "replace")
        return decode_tail(raw, int(line.get(f"{name}_bytes", len(raw))), max_chars)

    stdout, cut_out = text("stdout")
    stderr, cut_err = text("stderr")
    returncode = line.get("rc")
    timed_out = bool(line.get("timed_out"))
    signal = line.get("sig")
    if timed_out:
        status = "timeout"
    elif signal:
        status = "signal"
    elif returncode == 0:
        status = "ok"
    elif "MemoryError" in stderr:
        status = "memory"
    else:
        status = "error"
    return ExecResult(
        ok=returncode == 0 and not timed_out,
        stdout=stdout,
        stderr=stderr,
        returncode=None if timed_out else returncode,
        timed_out=timed_out,
        latency=harness.latency,
        status=status,
        signal=signal,
        truncated=cut_out or cut_err,
        exec_s=float(line.get("exec_s", 0.0)),
        queue_s=harness.queue_s,
        worker=harness.worker,
        zygote=harness.zygote,
    )
