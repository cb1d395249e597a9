"""Error types: the exception a traceback ends with, and the kinds without one."""

from __future__ import annotations

from collections import Counter

from codepool.common import ExecResult, error_type
from codepool.common.error_types import exception_name, ranked

CHAINED = """Traceback (most recent call last):
  File "<sandbox>", line 3, in f
    1/0
    ~^~
ZeroDivisionError: division by zero

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "<sandbox>", line 6, in <module>
    f()
  File "<sandbox>", line 5, in f
    raise KeyError("k") from e
KeyError: 'k'
"""
MULTILINE_MESSAGE = """Traceback (most recent call last):
  File "<sandbox>", line 1, in <module>
    raise ValueError("a\\nb")
ValueError: a
b
"""
SYNTAX = """  File "<sandbox>", line 1
    x = (
        ^
SyntaxError: '(' was never closed
"""


def _failed(stderr: str = "", **fields: object) -> ExecResult:
    base: dict[str, object] = dict(
        ok=False, stdout="", stderr=stderr, returncode=1, timed_out=False, latency=0.01
    )
    base["status"] = "error"
    base.update(fields)
    return ExecResult(**base)  # type: ignore[arg-type]


def test_exception_name_is_the_line_after_the_last_frame() -> None:
    assert exception_name(CHAINED) == "KeyError"
    assert exception_name(MULTILINE_MESSAGE) == "ValueError"
    assert exception_name(SYNTAX) == "SyntaxError"
    dotted = 'Traceback (most recent call last):\n  File "x.py", line 1\n'
    dotted += "numpy.linalg.LinAlgError: x\n"
    assert exception_name(dotted) == "numpy.linalg.LinAlgError"
    # A cut-off tail without frames: only a last line that reads like an exception counts.
    assert exception_name("...\nModuleNotFoundError: No module named 'z'\n") == (
        "ModuleNotFoundError"
    )
    assert exception_name("bye\n") is None
    assert exception_name("") is None


def test_error_type_of_each_kind_of_failure() -> None:
    assert error_type(_failed(status="ok", ok=True, returncode=0)) is None
    assert error_type(_failed(CHAINED)) == "KeyError"
    assert error_type(_failed(status="timeout", timed_out=True, returncode=None)) == "timeout"
    assert error_type(_failed("codepool: sandbox setup failed", status="infra")) == "infra"
    assert error_type(_failed("code is not a string", status="rejected")) == "rejected"
    assert error_type(_failed(status="signal", returncode=-9, signal=9)) == "signal SIGKILL"
    assert error_type(_failed("bye\n", returncode=3)) == "exit 3"  # raise SystemExit("bye")
    assert error_type(_failed(status="memory")) == "MemoryError"


def test_ranked_breaks_ties_by_name() -> None:
    counts = Counter({"NameError": 1, "timeout": 3, "AttributeError": 1})
    assert ranked(counts) == [("timeout", 3), ("AttributeError", 1), ("NameError", 1)]
