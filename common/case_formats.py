"""Test cases in the formats code-RL datasets carry them, as ``Case`` lists for
``run_tests`` (common/reward_tests.py).

- assert tests (HumanEval, MBPP): statements run after the candidate, which passes
  when they exit 0 (``assert_cases``);
- stdin/stdout tests (APPS, CodeContests): the program reads each input and must print
  the output (``stdio_cases``);
- call-based tests (APPS' ``fn_name``, LeetCode): each input is the arguments, one JSON
  value a line; the function (or ``Solution().fn_name``) is called with them and what
  it returns is printed as SandboxFusion's clients print it (``call_cases``);
- verl's ``sandbox_fusion`` ground truth: a JSON object (or its text) with ``inputs``
  and ``outputs``, optionally ``fn_name`` and ``assert_case`` (``sandbox_fusion_cases``).

Each gives the programs verl's ``sandbox_fusion`` reward sends one per case, so each
case gets the verdict it gets there.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from codepool.common.errors import ConfigError
from codepool.common.reward_tests import Case

# What SandboxFusion's clients put before a call-based candidate: these modules, both
# star-imported and by name, so a candidate may use ``sqrt`` or ``Counter`` unimported.
CALL_MODULES = (
    "string re datetime collections heapq bisect copy math random statistics itertools "
    "functools operator io sys json"
).split()
CALL_PREFIX = (
    "\nimport traceback\n"
    + "".join(f"from {name} import *\n" for name in [*CALL_MODULES, "builtins", "typing"])
    + "".join(f"import {name}\n" for name in CALL_MODULES)
    + "\n"
)
# Appended after the candidate (and its assert case, if any): read the arguments from
# stdin, call, print the result. A failure is written to stderr and the program still
# exits 0 with nothing printed, as there.
CALL_DRIVER = """
_CODEPOOL_FN_NAME = {fn_name!r}


def _codepool_call():
    raw = sys.stdin.read()
    args = []
    if raw.strip():
        try:
            args = [json.loads(line) for line in raw.split("\\n")]
        except json.JSONDecodeError as exc:
            sys.stderr.write(f"invalid JSON input for {{_CODEPOOL_FN_NAME!r}}: {{exc}}\\n")
            return None, True
    try:
        target = None
        if _CODEPOOL_FN_NAME in globals():
            target = globals()[_CODEPOOL_FN_NAME]
        elif "Solution" in globals():
            target = getattr(globals()["Solution"](), _CODEPOOL_FN_NAME)
        if not target:
            sys.stderr.write(f"function {{_CODEPOOL_FN_NAME!r}} not found\\n")
            return None, True
        return target(*args), False
    except Exception:
        sys.stderr.write(f"calling {{_CODEPOOL_FN_NAME!r}} failed:\\n{{traceback.format_exc()}}\\n")
        return None, True


if __name__ == "__main__":
    _codepool_result, _codepool_failed = _codepool_call()
    if not _codepool_failed:
        if _codepool_result is None or isinstance(_codepool_result, (dict, list, tuple, bool)):
            print(json.dumps(_codepool_result))
        else:
            print(str(_codepool_result))
"""


def assert_cases(asserts: Sequence[str]) -> list[Case]:
    """One case per assert statement (or block of them): passes when it exits 0."""
    return [Case(code=_text(code, "an assert case")) for code in asserts]


def stdio_cases(inputs: Sequence[Any], outputs: Sequence[Any]) -> list[Case]:
    """One case per input/output pair: the program reads the input on stdin and must
    print the output (trailing newlines aside; an output of None: exiting 0 passes)."""
    _same_length(inputs, outputs)
    return [
        Case(stdin=None if given is None else str(given), expected_stdout=_expected(wanted))
        for given, wanted in zip(inputs, outputs, strict=True)
    ]


def call_cases(
    fn_name: str, inputs: Sequence[Any], outputs: Sequence[Any]
) -> tuple[str, list[Case]]:
    """The prefix and cases of call-based tests: each input holds the arguments, one
    JSON value a line; ``fn_name`` (or ``Solution().fn_name``) is called with them and
    what it returns is printed (JSON for containers, bools and None; ``str`` else)."""
    if not isinstance(fn_name, str) or not fn_name.isidentifier():
        raise ConfigError(f"fn_name must be an identifier, got {fn_name!r}")
    _same_length(inputs, outputs)
    driver = CALL_DRIVER.format(fn_name=fn_name)
    cases = [
        Case(
            code=driver,
            stdin=None if given is None else str(given),
            expected_stdout=_expected(wanted),
        )
        for given, wanted in zip(inputs, outputs, strict=True)
    ]
    return CALL_PREFIX, cases


def sandbox_fusion_cases(ground_truth: Any) -> tuple[str, list[Case]]:
    """The prefix and cases of verl's ``sandbox_fusion`` ground truth (a dict or its
    JSON text): ``inputs``/``outputs``, optional ``fn_name``, optional ``assert_case``
    (statements appended per case). ConfigError when it is malformed."""
    if isinstance(ground_truth, (str, bytes)):
        try:
            ground_truth = json.loads(ground_truth)
        except ValueError as exc:
            raise ConfigError(f"ground truth is not JSON: {exc}") from None
    if not isinstance(ground_truth, dict):
        raise ConfigError("ground truth must be an object with inputs and outputs")
    asserts = ground_truth.get("assert_case")
    if isinstance(asserts, list):
        inputs = ground_truth.get("inputs", [""] * len(asserts))
        outputs = ground_truth.get("outputs", [None] * len(asserts))
    elif "inputs" in ground_truth and "outputs" in ground_truth:
        inputs, outputs = ground_truth["inputs"], ground_truth["outputs"]
        asserts = [""] * len(inputs) if isinstance(inputs, list) else []
    else:
        raise ConfigError("ground truth has no inputs/outputs")
    if not isinstance(inputs, list) or not isinstance(outputs, list):
        raise ConfigError("ground truth inputs and outputs must be lists")
    _same_length(inputs, outputs)
    if len(asserts) != len(inputs):
        raise ConfigError(f"{len(asserts)} assert cases for {len(inputs)} inputs")
    fn_name = ground_truth.get("fn_name")
    if fn_name:
        prefix, cases = call_cases(fn_name, inputs, outputs)
    else:
        prefix, cases = "", stdio_cases(inputs, outputs)
    return prefix, [
        Case(
            code=_text(extra, "an assert case") + case.code,
            stdin=case.stdin,
            expected_stdout=case.expected_stdout,
        )
        for extra, case in zip(asserts, cases, strict=True)
    ]


def _expected(wanted: Any) -> str | None:
    return None if wanted is None else str(wanted)


def _same_length(inputs: Sequence[Any], outputs: Sequence[Any]) -> None:
    if len(inputs) != len(outputs):
        raise ConfigError(f"{len(inputs)} inputs but {len(outputs)} outputs")


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{what} must be str, got {type(value).__name__}")
    return value
