"""The end of a snippet's interpreter, as ``Py_FinalizeEx`` ends ``python -c``'s.

After the threads and atexit (runtime.finish_threads_and_atexit), Python flushes
``sys.stdout`` and ``sys.stderr`` (a failure makes the exit status 120), puts the
original streams back, and destroys the modules: ``__main__`` first, by reference
counting and then by the collector, so the snippet's open files are flushed and closed,
its ``__del__`` methods, its suspended generators' ``finally`` blocks and its pending
asyncio tasks' cleanups run, and what they raise is printed as "Exception ignored in".
Last, the original streams are flushed as their objects die.

The child does the same for everything the snippet made: ``__main__`` and the garbage
the collector finds (the zygote froze its own heap, so a collection walks the snippet's
objects only). The modules the zygote preloaded are not torn down: their objects are
the image's, shared with every other child, and tearing them down would copy every page
of it (the README's "differences from python -c" says so).
"""

from __future__ import annotations

import _weakref
import gc
import os
import sys
import types
from typing import Any

# How many collections of the two older generations had run when the snippet's
# interpreter was prepared (note_start), in a list so that no global is rebound.
_at_start: list[tuple[int, int]] = [(-1, -1)]


def note_start() -> None:
    """Called as the snippet's interpreter is prepared: what finalize's last collection
    compares with."""
    _at_start[0] = _collections()


def _collections() -> tuple[int, int]:
    stats = gc.get_stats()
    return stats[1]["collections"], stats[2]["collections"]


# Where the harness's own frames are: tracebacks start below them.
_HARNESS_FILES = (__file__, __file__.replace("finalization.py", "runtime.py"))


def exit_status(code: Any) -> int:
    """The status ``sys.exit(code)`` ends ``python -c`` with; a code that is not an int is
    printed first, as Python prints it (to fd 2 when ``sys.stderr`` is gone)."""
    if code is None:
        return 0
    if isinstance(code, int):
        # C's (int)PyLong_AsLong: -1 when it does not fit a C long.
        return (code if -(1 << 63) <= code < 1 << 63 else -1) & 0xFF
    stderr = getattr(sys, "stderr", None)
    text = None
    if stderr is not None:
        try:
            stderr.write(str(code))
        except Exception:  # as Python's: a failed print is not reported
            pass
    else:
        try:
            text = str(code)
        except Exception:
            text = ""
    write_stderr("\n" if text is None else text + "\n")
    return 1


def write_stderr(text: str) -> None:
    """``PySys_WriteStderr``: to ``sys.stderr``, or to fd 2 when it cannot take it."""
    try:
        sys.stderr.write(text)
    except Exception:
        try:
            os.write(2, text.encode("utf-8", "backslashreplace"))
        except OSError:
            pass


def finalize(code: int, fresh: Any) -> int:
    """Everything ``Py_FinalizeEx`` does after atexit, for the snippet's objects; the
    exit code ``code`` becomes (120 when flushing stdout or stderr failed; a negative
    code, the signal of an unhandled KeyboardInterrupt, stays). ``fresh``: the
    runtime.Fresh installed for the snippet (its ``main`` is dropped here), or None."""
    flushed = _flush_std_files()
    _restore_streams()
    _flush_open_files()
    _destroy_main(fresh)
    if fresh is not None:
        for stream in (fresh.stdout, fresh.stderr):
            _quiet_flush(stream)
    for name in ("__stdout__", "__stderr__"):
        _quiet_flush(getattr(sys, name, None))
    if not flushed and code >= 0:
        return 120
    return code


def _is_closed(stream: Any) -> bool:
    try:
        return bool(stream.closed)
    except Exception:
        return False


def _flush_std_files() -> bool:
    """``flush_std_files``: stdout's failure is reported, stderr's is not."""
    ok = True
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name, None)
        if stream is None or _is_closed(stream):
            continue
        try:
            stream.flush()
        except Exception as exc:
            ok = False
            if name == "stdout":
                write_unraisable(exc, stream)
    return ok


def write_unraisable(exc: BaseException, obj: object) -> None:
    """As Python's default unraisable hook reports ``exc`` raised in ``obj``, from the
    snippet's first frame (none of the harness's)."""
    import traceback

    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename in _HARNESS_FILES:
        tb = tb.tb_next
    try:
        described = repr(obj)
    except Exception:
        described = "<object repr() failed>"
    text = f"Exception ignored in: {described}\n"
    text += "".join(traceback.format_exception(type(exc), exc, tb))
    stderr = getattr(sys, "stderr", None)
    if stderr is None:
        return
    try:
        stderr.write(text)
        stderr.flush()
    except Exception:
        pass


def _restore_streams() -> None:
    """``finalize_modules_delete_special``: the streams back to the originals, and the
    last error's record gone."""
    for name in ("stdin", "stdout", "stderr"):
        setattr(sys, name, getattr(sys, f"__{name}__", None))
    for name in ("last_type", "last_value", "last_traceback"):
        if hasattr(sys, name):
            delattr(sys, name)


def _destroy_main(fresh: Any) -> None:
    """``__main__`` dies as the reference's does: its namespace freed by reference
    counting where nothing cycles through it, by the collector (finalizers first, with the
    namespace intact) where a function or class does; then the snippet's other garbage."""
    main = sys.modules.get("__main__")
    if fresh is not None and getattr(fresh, "main", None) is main:
        fresh.main = None
    if isinstance(main, types.ModuleType):
        namespace = main.__dict__
        survivor = _weakref.ref(main)
        sys.modules["__main__"] = None  # type: ignore[assignment]
        del main
        # Two references (this name and the call's argument): the namespace dies now, by
        # reference counting; more (a function's globals, a class's methods): only the
        # collector frees it.
        cyclic = sys.getrefcount(namespace) > 2
        del namespace
        if cyclic:
            gc.collect()
        alive = survivor()
        if alive is not None:  # still referenced: cleared as Python clears such modules
            _clear_module(alive)
            del alive
    # The snippet's other garbage: the two youngest generations hold all of it unless a
    # collection of the middle one moved some to the oldest meanwhile (a full collection
    # also empties the free lists, whose pages are the zygote's: it copies each).
    gc.collect(2 if _collections() != _at_start[0] else 1)


def _flush_open_files() -> None:
    """What the snippet wrote to files it left open reaches them, as their finalisers
    would write it when the modules die: the collector may finalise a file's raw
    object before its buffer (an order of its own, which the reference's heap happens
    to avoid), and the buffer is lost."""
    import io

    text, binary = [], []
    for obj in gc.get_objects():  # the snippet's: the zygote's heap is frozen
        if isinstance(obj, io.TextIOWrapper):
            text.append(obj)
        elif isinstance(obj, (io.BufferedWriter, io.BufferedRandom)):
            binary.append(obj)
    for stream in [*text, *binary]:
        _quiet_flush(stream)
    text.clear()
    binary.clear()


def _clear_module(module: types.ModuleType) -> None:
    """``_PyModule_Clear``: names that start with one underscore first, then the rest,
    ``__builtins__`` kept."""
    namespace = module.__dict__
    for name in [n for n in namespace if isinstance(n, str) and n.startswith("_")]:
        if name.startswith("_") and not name.startswith("__"):
            namespace[name] = None
    for name in list(namespace):
        if name != "__builtins__":
            namespace[name] = None
    gc.collect()


def _quiet_flush(stream: Any) -> None:
    if stream is None:
        return
    try:
        if not _is_closed(stream):
            stream.flush()
    except Exception:  # as a stream's own finaliser: silent
        pass
