"""Notebook cells in one child: run in order in one ``__main__``, so state carries from
cell to cell, each cell's output told apart.

A cell's trailing expression is displayed as a notebook does (its repr, unless it is
None or the cell ends with ``;``); an exception ends the cell, not the notebook, and is
its ``error`` (ename, evalue, traceback lines, frames named ``<cell N>``); ``SystemExit``
ends the notebook, as it ends ``python -c``, with its status. After each
cell one JSON line goes to the record fd: where stdout and stderr stood (their offsets,
so output of subprocesses is counted too), the display and the error. The supervisor
slices the output streams by those offsets (see readback.py). A cell that outlives
``cell_timeout_s`` gets a TimeoutError and the next cell runs.
"""

from __future__ import annotations

import functools
import io
import json
import os
import signal
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any, NoReturn

from codepool.common.autoprint import compile_snippet
from codepool.worker.engine import runtime
from codepool.worker.engine.runtime import (
    evaluate,
    exit_as_python,
    format_exception,
    remember_source,
)

# What one record keeps of a display or an error (the supervisor cuts to the limits).
MAX_RECORD_CHARS = 1 << 16
MAX_TRACEBACK_LINES = 200


class CellTimeout(TimeoutError):
    pass


def cell_name(number: int) -> str:
    return f"<cell {number}>"


def run_cells(
    cells: list[str], cell_timeout_s: float | None, record_fd: int | None, *, rich: bool
) -> NoReturn:
    assert record_fd is not None
    runner = os.getpid()  # only this process writes records (never what a cell forks)
    streams = (sys.stdout, sys.stderr)  # Python's, whatever a cell rebinds
    # Its namespace's init, as a snippet's first process: signals with the default action
    # end it as they end any process (runtime.run_snippet says the same).
    runtime._arm_stand_ins(True)
    main = sys.modules["__main__"]
    status: int | None = None  # set when a cell ends the notebook (SystemExit)
    last: Callable[[], object] | None = None  # the last cell's record
    if cell_timeout_s is not None:
        signal.signal(signal.SIGALRM, _on_alarm(cell_timeout_s))
    for number, cell in enumerate(cells, 1):
        name = cell_name(number)
        if rich:
            remember_source(name, cell)
        display: str | None = None
        error: dict[str, Any] | None = None
        # As a snippet runs: its own argv, compiled as one (compile_snippet, no flags of
        # the harness), run with no harness frame below it (runtime.evaluate).
        sys.orig_argv = [*sys.orig_argv[:1], "-B", "-c", cell]
        undecodable = _undecodable(cell)
        try:
            if cell_timeout_s is not None:
                signal.setitimer(signal.ITIMER_REAL, cell_timeout_s)
            try:
                if undecodable is not None:  # as python -c refuses such a command
                    raise undecodable
                body, tail = compile_snippet(cell, auto_print=True, filename=name)
                evaluate(body, main.__dict__)
                if tail is not None:
                    value = evaluate(tail, main.__dict__)
                    if value is not None and not cell.rstrip().endswith(";"):
                        display = repr(value)
                    value = None  # kept by __main__ only, as a snippet's
            finally:
                if cell_timeout_s is not None and os.getpid() == runner:
                    signal.setitimer(signal.ITIMER_REAL, 0)
        except BaseException as exc:
            if os.getpid() != runner:
                _end_fork(exc)
            if isinstance(exc, SystemExit):  # as python -c: it ends the notebook
                status = runtime._exit_code(exc)  # its message printed, on the cell's stderr
            else:
                error, status = _error(exc, name, rich=rich, stderr=streams[1])
        if os.getpid() != runner:
            _end_fork(None)
        if number == len(cells) or status is not None:
            last = functools.partial(_record, record_fd, display, error)
            break
        for stream in streams:  # what a cell printed before it rebound sys.stdout is its own
            try:
                stream.flush()
            except Exception:  # closed by the cell
                pass
        _record(record_fd, display, error)
    # The notebook's end is a snippet's (its threads, atexit, __main__'s finalisers, the
    # status 120 rule): what it prints is the last cell's. Nothing here holds __main__
    # (it dies as the reference's does, by reference counting where it can).
    del main
    exit_as_python(status or 0, last)


def _end_fork(exc: BaseException | None) -> NoReturn:
    """A process a cell forked, done with its copy of the cell: it ends as a process a
    snippet forked does (an error printed, SystemExit's code), never running the next
    cells or writing their records."""
    code = 0
    if isinstance(exc, SystemExit):
        code = runtime._exit_code(exc)
    elif exc is not None:
        try:
            sys.stderr.write(format_exception(exc, lambda filename: filename.startswith("<cell ")))
        except Exception:  # no stderr to print on: as Python, the exit code says it
            pass
        code = -signal.SIGINT if isinstance(exc, KeyboardInterrupt) else 1
    exit_as_python(code)


class Undecodable(Exception):
    """A cell that is no UTF-8 (a lone surrogate): ``error`` is what ``python -c`` says
    of such a command, its argv decoded with surrogateescape and encoded again."""

    def __init__(self, error: UnicodeEncodeError) -> None:
        super().__init__(str(error))
        self.error = error


def _undecodable(cell: str) -> Undecodable | None:
    try:
        cell.encode("utf-8")
        return None
    except UnicodeEncodeError as exc:
        first = exc
    argv = cell.encode("utf-8", "surrogatepass").decode("utf-8", "surrogateescape")
    try:
        argv.encode("utf-8")
    except UnicodeEncodeError as exc:
        return Undecodable(exc)
    return Undecodable(first)


def _on_alarm(cell_timeout_s: float) -> Any:
    def handler(signum: int, frame: FrameType | None) -> None:
        raise CellTimeout(f"the cell ran past its cell_timeout of {cell_timeout_s:g} s")

    return handler


def _error(
    exc: BaseException, name: str, *, rich: bool, stderr: Any
) -> tuple[dict[str, Any], int | None]:
    """The record's error: its traceback lines are what Python's PyErr_Print would have
    printed on stderr (runtime.print_exception: through ``sys.excepthook``, "Did you
    mean" included), taken from ``sys.stderr`` for the time of the call where that is
    still the notebook's open ``stderr``; where the cell rebound, deleted or closed it,
    printed there,
    as Python prints it (the record has no lines). And the status the notebook ends with
    when the cell's hook raised SystemExit."""
    status = None
    if isinstance(exc, CellTimeout):  # the runner's own: no hook of the cell's
        text = format_exception(exc, lambda filename: filename.startswith("<cell "))
    elif isinstance(exc, Undecodable):  # python -c's words, before anything runs
        exc = exc.error
        text = "Unable to decode the command from the command line:\n" + "".join(
            __import__("traceback").format_exception_only(type(exc), exc)
        )
    else:
        text, status = _printed(exc, name, rich=rich, stderr=stderr)
    lines = text.rstrip("\n").split("\n")[-MAX_TRACEBACK_LINES:] if text else []
    ename = "TimeoutError" if isinstance(exc, CellTimeout) else type(exc).__name__
    error = {"ename": ename, "evalue": _evalue(exc)[-MAX_RECORD_CHARS:], "traceback": lines}
    return error, status


def _printed(exc: BaseException, name: str, *, rich: bool, stderr: Any) -> tuple[str, int | None]:
    said = io.StringIO()
    before = sys.__dict__.get("stderr", _MISSING)
    if before is not stderr or getattr(stderr, "closed", False):  # as Python prints it there
        try:
            return "", runtime.print_exception(exc, rich=rich, filename=name)
        except BaseException:  # what PyErr_Print could not print is not printed
            return "", None
    sys.stderr = said
    status = None
    try:
        status = runtime.print_exception(exc, rich=rich, filename=name)
    except BaseException:  # what PyErr_Print could not print is not printed
        pass
    finally:
        if before is _MISSING:
            del sys.stderr
        else:
            sys.stderr = before
    return said.getvalue(), status


def _evalue(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # as Python's display: <exception str() failed>
        return "<exception str() failed>"


_MISSING = object()


def _position(fd: int, stream: Any) -> int:
    try:
        stream.flush()
    except Exception:  # the cell may have closed or replaced the stream
        pass
    try:
        return os.lseek(fd, 0, os.SEEK_CUR)
    except OSError:
        return -1


def _record(record_fd: int, display: str | None, error: dict[str, Any] | None) -> None:
    record: dict[str, Any] = {
        "out": _position(1, getattr(sys, "stdout", None)),  # a cell may delete them
        "err": _position(2, getattr(sys, "stderr", None)),
        "error": error,
    }
    if display is not None:
        record["display"] = display[-MAX_RECORD_CHARS:]
        record["display_chars"] = len(display)
    try:
        # On a line of its own, whatever the cell wrote to this fd before it.
        os.write(record_fd, b"\n" + json.dumps(record).encode() + b"\n")
    except (OSError, ValueError):
        pass  # over the file size limit, or the cell closed the fd: no more records
