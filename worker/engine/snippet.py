"""Run one snippet as ``python -c`` would, inside an already isolated child.

Fork mode calls :func:`run_snippet` in the forked child; spawn mode runs this module
in a fresh interpreter (``python -I -B -m codepool.worker.engine.snippet``) with the source on
fd 3. Either way the process exits with the snippet's exit code, tracebacks show only
``<sandbox>`` frames, and stdout/stderr are fds 1 and 2.
"""

from __future__ import annotations

import atexit
import linecache
import os
import sys
import types
from typing import TYPE_CHECKING, NoReturn

from codepool.common.autoprint import FILENAME, compile_snippet
from codepool.worker.engine import contract

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import TextIO

CODE_FD = contract.REQUEST_FD  # spawn mode: the source, where the request socket was
# What finish calls with the exit code first, to tell the supervisor the snippet ended
# before the exit's teardown of the image (a millisecond or more; see done.py): say_done,
# or _nativechild.say_done where the C module was built. A snippet can write a notice
# itself: that ends it there, as its own os._exit would.
done_notice: Callable[[int], object] | None = None


class Fresh:
    """A ``__main__`` module and stdio objects nobody has used yet.

    The zygote makes one and every forked child installs its own copy of it, so
    children do not pay for building them. The streams name fds 0-2, which each child
    points at its own /dev/null and output files before installing them. (A plain
    class: the bare zygote's image has no dataclasses, see bare.py.)
    """

    __slots__ = ("main", "stderr", "stdin", "stdout")

    def __init__(
        self, *, main: types.ModuleType, stdin: TextIO, stdout: TextIO, stderr: TextIO
    ) -> None:
        self.main, self.stdin, self.stdout, self.stderr = main, stdin, stdout, stderr

    @classmethod
    def create(cls) -> Fresh:
        main = types.ModuleType("__main__")
        main.__dict__["__builtins__"] = __builtins__
        return cls(
            main=main,
            stdin=open(0, encoding="utf-8", errors="replace", closefd=False),
            stdout=open(1, "w", encoding="utf-8", errors="backslashreplace", closefd=False),
            stderr=open(
                2, "w", encoding="utf-8", errors="backslashreplace", closefd=False, buffering=1
            ),
        )


def format_exception(exc: BaseException, first_frame: Callable[[str], bool]) -> str:
    """The traceback as ``python -c`` prints it, from the user's first frame (the
    harness's frames above it dropped)."""
    import traceback

    tb = exc.__traceback__
    while tb is not None and not first_frame(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def remember_source(filename: str, source: str | bytes) -> None:
    """Let tracebacks show ``filename``'s lines (the rich form; without it a frame reads
    ``File "<sandbox>", line N, in f`` and nothing more, as the reference's do)."""
    text = source.decode("utf-8", "replace") if isinstance(source, bytes) else source
    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)


def _exit_code(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # the snippet may have closed or replaced its streams
            pass


def finish_threads_and_atexit() -> None:
    """What Python's own exit does after the main module: wait for the threads (those
    of ``threading``, only where it was imported, as Python does), then atexit."""
    threading = sys.modules.get("threading")
    if threading is not None and _threads_to_finish(threading):
        threading._shutdown()
    atexit._run_exitfuncs()


def _threads_to_finish(threading: types.ModuleType) -> bool:
    """Whether threading's shutdown has anything to do: threads besides the main one
    (the main thread's own lock is always among the shutdown locks), or its own atexit
    hooks (concurrent.futures registers one on import). Without them it would only mark
    the main thread stopped, which nothing after it can see but an atexit hook asking,
    and cost each child some 50 copied pages."""
    try:
        return bool(
            threading._threading_atexits
            or len(threading._shutdown_locks) > 1
            or threading._limbo
            or len(threading._active) > 1
        )
    except AttributeError:  # another Python's threading: let it decide
        return True


def prepare(fresh: Fresh) -> None:
    """Make this process look like a fresh ``python -c`` (before the source is known)."""
    sys.stdin = sys.__stdin__ = fresh.stdin  # type: ignore[misc,assignment]
    sys.stdout = sys.__stdout__ = fresh.stdout  # type: ignore[misc,assignment]
    sys.stderr = sys.__stderr__ = fresh.stderr  # type: ignore[misc,assignment]
    atexit._clear()
    sys.argv = ["-c"]
    if not sys.path or sys.path[0] != "":
        sys.path.insert(0, "")  # like `python -c`: the snippet may import from its cwd
    sys.modules["__main__"] = fresh.main


# A snippet's first lines write to pages the child shares with its zygote (the
# allocator's arenas, the compiler's and the eval loop's state), and each first write
# copies one. A waiting child compiles and runs this once, so most of those copies are
# made before its request comes rather than after: a plain snippet's first line starts
# some 0.4 ms sooner after a pause (measured from the supervisor's send), at some 50
# more pages copied per child.
WARM_SOURCE = b"value = 2 + 3\nvalue"


def warm_up() -> None:
    """In a waiting child: what a small snippet would run, results discarded (nothing
    the snippet can see changes)."""
    try:
        body, tail = compile_snippet(WARM_SOURCE, auto_print=True)
        scratch = {"__builtins__": __builtins__}
        exec(body, scratch)
        if tail is not None:
            repr(eval(tail, scratch))
    except Exception:  # a speed-up only: the child serves as well without it
        pass


def finish(code: int) -> NoReturn:
    """Flush what the snippet printed, tell the supervisor, and exit with ``code``."""
    _flush()
    if done_notice is not None:
        done_notice(code)
    os._exit(code)


def say_done(code: int) -> None:
    """The notice on contract.DONE_FD, in Python (where the C module was not built); only
    the snippet's first process says it (contract.FIRST_PID)."""
    if os.getpid() != contract.FIRST_PID:
        return
    import resource  # both loaded already in every image that calls this (child.py)
    import struct

    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime
    rss = max(own.ru_maxrss, reaped.ru_maxrss)
    try:
        with open("/proc/sys/kernel/ns_last_pid", "rb") as f:
            last_pid = int(f.read())
    except (OSError, ValueError):
        last_pid = -1
    notice = struct.pack(
        contract.DONE_FORMAT, code, contract.DONE_MAGIC, round(cpu_s * 1e6), rss, last_pid
    )
    try:
        os.write(contract.DONE_FD, notice)
    except OSError:
        pass  # full or closed: the supervisor waits for the exit instead


def run_snippet(source: bytes, *, auto_print: bool, rich: bool = False) -> NoReturn:
    """Execute ``source`` as ``__main__`` and exit the process with its exit code.

    Call :func:`prepare` first (fork mode does so while waiting for the request).
    rich: tracebacks show source lines and markers.
    """
    main = sys.modules["__main__"]
    if rich:
        remember_source(FILENAME, source)
    code = 0
    try:
        try:
            body, tail = compile_snippet(source, auto_print=auto_print)
        except (SyntaxError, ValueError) as exc:
            if isinstance(exc, ValueError):  # NUL bytes on some Python versions
                exc = SyntaxError(str(exc))
            raise exc from None
        exec(body, main.__dict__)
        if tail is not None:
            value = eval(tail, main.__dict__)
            if value is not None:
                print(repr(value))
        finish_threads_and_atexit()
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException as exc:
        sys.stderr.write(format_exception(exc, FILENAME.__eq__))
        code = 1
    finish(code)


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def main() -> NoReturn:
    """Spawn-mode entry: source on fd 3 (notebook cells: a JSON list, records to fd 4),
    flags on the command line: ``--auto-print``, ``--rich-tracebacks``,
    ``--cells CELL_TIMEOUT_S`` (empty: none)."""
    source = _read_all(CODE_FD)
    flags = sys.argv[1:]
    rich = "--rich-tracebacks" in flags
    prepare(Fresh.create())
    if "--cells" in flags:
        import json

        from codepool.worker.engine import cells

        timeout = flags[flags.index("--cells") + 1]
        cell_timeout_s = float(timeout) if timeout else None
        cells.run_cells(json.loads(source), cell_timeout_s, contract.RECORD_FD, rich=rich)
    run_snippet(source, auto_print="--auto-print" in flags, rich=rich)


if __name__ == "__main__":
    main()
