"""Error types: what kind of failure a result is, for breakdowns over a whole dataset.

A Python exception is named as its traceback names it (``ZeroDivisionError``,
``numpy.linalg.LinAlgError``); the failures that carry no traceback are kinds of their own:
``timeout``, ``infra``, ``rejected``, ``signal SIGKILL``, ``exit 2``.
"""

from __future__ import annotations

import re
import signal
from collections import Counter

from codepool.common.result import ExecResult

# Statuses whose kind is the status itself: no user traceback explains them.
OWN_KINDS = ("timeout", "infra", "rejected")
# "ValueError: msg", "numpy.linalg.LinAlgError: msg", "KeyboardInterrupt".
_EXCEPTION_LINE = re.compile(
    r"(?P<name>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?::(?: (?P<message>.*))?)?"
)
# Without a frame to anchor on, only a name that reads like an exception is trusted.
_EXCEPTION_NAME = re.compile(r"(Error|Exception|Exit|Interrupt|Warning|Iteration|Group)$")
_FRAME = '  File "'


def error_type(result: ExecResult) -> str | None:
    """The kind of failure of ``result``; ``None`` when it succeeded."""
    if result.status == "ok":
        return None
    if result.status in OWN_KINDS:
        return result.status
    name = exception_name(result.stderr)
    if name is not None:
        return name
    if result.status == "memory":
        return "MemoryError"
    if result.signal is not None:
        return f"signal {_signal_name(result.signal)}"
    return f"exit {result.returncode}"


def ranked(counts: Counter[str]) -> list[tuple[str, int]]:
    """Error types by count, most common first; ties by name (a stable order to read)."""
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))


def exception_name(stderr: str) -> str | None:
    """The exception a Python traceback in ``stderr`` ends with, or ``None``."""
    final = final_exception(stderr)
    return None if final is None else final[0]


def final_exception(stderr: str) -> tuple[str, str] | None:
    """The name and the message's first line of the exception a Python traceback in
    ``stderr`` ends with, or ``None``.

    The exception line is the first unindented line after the last frame line, so a
    multi-line message or a chained traceback still names the exception that ended the
    program; without any frame (a cut-off tail), the last line counts if it reads like one.
    """
    lines = stderr.splitlines()
    frames = [i for i, line in enumerate(lines) if line.startswith(_FRAME)]
    if frames:
        for line in lines[frames[-1] + 1 :]:
            if line and not line[0].isspace():
                match = _EXCEPTION_LINE.fullmatch(line)
                return (match["name"], match["message"] or "") if match else None
        return None
    last = next((line for line in reversed(lines) if line.strip()), "")
    match = _EXCEPTION_LINE.fullmatch(last)
    if match and _EXCEPTION_NAME.search(match["name"]):
        return match["name"], match["message"] or ""
    return None


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)
