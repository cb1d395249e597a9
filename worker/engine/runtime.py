"""Run one snippet as ``python -c`` would, inside an already isolated child.

Fork mode calls :func:`run_snippet` in the forked child; spawn mode runs it in a fresh
interpreter (spawn_entry.py). Either way the snippet sees what ``python -B -c`` would
show it: a ``__main__`` and stdio made as Python makes them, no frame of the harness
below its own (``_nativechild.run_main``), the signal dispositions of a fresh
interpreter, errors printed by ``sys.excepthook`` (so "Did you mean" and the rest of
the interpreter's own wording), and an end as Python's: threads waited for, atexit run,
the exit code (or the signal, after an unhandled KeyboardInterrupt). Its frames are
named ``<sandbox>``. What still differs from the reference, and why, is listed in the
README.
"""

from __future__ import annotations

import atexit
import builtins
import io
import linecache
import os
import signal as _signal
import sys
import types
from typing import TYPE_CHECKING, Any, NoReturn

from codepool.common.autoprint import FILENAME, compile_snippet
from codepool.worker.engine import contract, finalization

_evaluate: Callable[[types.CodeType, dict[str, Any]], Any] | None
_call_bare: Callable[[Callable[[], object]], object]
_arm_stand_ins: Callable[[bool], int]
try:
    from codepool.worker.engine._nativechild import arm_stand_ins as _arm_stand_ins
    from codepool.worker.engine._nativechild import call_bare as _call_bare
    from codepool.worker.engine._nativechild import run_main as _evaluate
except ImportError:  # no compiler at install time: the harness's frames show below,
    _evaluate = None  # and the signals an init is spared stay spared (README)

    def _call_bare(function: Callable[[], object]) -> object:
        return function()

    def _arm_stand_ins(snippet: bool) -> int:
        return 0


if TYPE_CHECKING:
    from collections.abc import Callable

# What finish calls with the exit code first, to tell the supervisor the snippet ended
# before the exit's teardown of the image (a millisecond or more; see done.py): say_done,
# or _nativechild.say_done where the C module was built. A snippet can write a notice
# itself: that ends it there, as its own os._exit would.
done_notice: Callable[[int], object] | None = None
# The Fresh that prepare installed: its ``__main__`` is let go at the end, so that the
# snippet's namespace dies as the reference's does (finalization.py).
installed: Fresh | None = None


class Fresh:
    """A ``__main__`` module and stdio objects nobody has used yet.

    The zygote makes one and every forked child installs its own copy of it, so
    children do not pay for building them. The streams name fds 0-2, which each child
    points at its own /dev/null and output files before installing them. (A plain
    class: the bare zygote's image has no dataclasses, see bare.py.)
    """

    __slots__ = ("main", "stderr", "stdin", "stdout")

    def __init__(self, *, main: types.ModuleType, stdin: Any, stdout: Any, stderr: Any) -> None:
        self.main, self.stdin, self.stdout, self.stderr = main, stdin, stdout, stderr

    @classmethod
    def create(cls, *, unbuffered: bool = False) -> Fresh:
        """As a fresh ``python -c`` makes them, in this interpreter's locale: the streams'
        encodings and error handlers are those Python chose for this process's own, and
        its output files are no terminal. ``unbuffered``: as with PYTHONUNBUFFERED."""
        own = sys.__stdout__ or sys.stdout
        encoding = getattr(own, "encoding", None) or "utf-8"
        errors = getattr(own, "errors", None) or "strict"
        return cls(
            main=fresh_main(),
            stdin=_stdio(0, "<stdin>", encoding, errors, unbuffered=False),
            stdout=_stdio(1, "<stdout>", encoding, errors, unbuffered=unbuffered),
            stderr=_stdio(2, "<stderr>", encoding, "backslashreplace", unbuffered=unbuffered),
        )


def fresh_main() -> types.ModuleType:
    """``__main__`` as ``python -c`` has it before the first line."""
    main = types.ModuleType("__main__")
    main.__loader__ = builtins.__loader__  # BuiltinImporter, as the reference's
    main.__dict__.update(__annotations__={}, __builtins__=builtins)
    return main


def _stdio(fd: int, name: str, encoding: str, errors: str, *, unbuffered: bool) -> Any:
    # CPython's create_stdio, for a stream that is no terminal.
    writing = fd != 0
    buffered = not (unbuffered and writing)
    binary: Any = open(fd, "wb" if writing else "rb", -1 if buffered else 0, closefd=False)
    raw = binary.raw if buffered else binary
    raw.name = name
    stream: Any = io.TextIOWrapper(
        binary,
        encoding,
        errors,
        "\n",
        line_buffering=buffered and fd == 2,
        write_through=not buffered,
    )
    stream.mode = "w" if writing else "r"
    return stream


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


def finish_threads_and_atexit() -> None:
    """What Python's own exit does after the main module: wait for the threads (those
    of ``threading``, only where it was imported, as Python does), then atexit."""
    threading = sys.modules.get("threading")
    if threading is not None and _threads_to_finish(threading):
        _call_bare(threading._shutdown)
    _call_bare(atexit._run_exitfuncs)


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


def reference_signals() -> None:
    """Signal dispositions as a fresh ``python -c`` has them: Python's handler for
    SIGINT (KeyboardInterrupt), SIGPIPE and SIGXFSZ ignored, every other signal's
    default. (The zygote's own are its owner's: SIGINT ignored, SIGTERM an exit.)"""
    for signum in range(1, _signal.NSIG):
        if signum in (_signal.SIGKILL, _signal.SIGSTOP):
            continue
        wanted: Any = _signal.SIG_DFL
        if signum == _signal.SIGINT:
            wanted = _signal.default_int_handler
        elif signum in (_signal.SIGPIPE, _signal.SIGXFSZ):
            wanted = _signal.SIG_IGN
        try:
            if _signal.getsignal(signum) != wanted:
                _signal.signal(signum, wanted)
        except (OSError, ValueError):  # the C library's own (32, 33): never settable
            pass
    # Handlers that stand for the default action where a snippet is its namespace's
    # init (a zygote's are every child's: armed once, here).
    _arm_stand_ins(False)


def prepare(fresh: Fresh) -> None:
    """Make this process look like a fresh ``python -c`` (before the source is known)."""
    global installed
    installed = fresh
    finalization.note_start()
    # The harness's extension modules are no modules of the snippet's: a fatal error's
    # "Extension modules:" line lists every one in sys.modules. Their users hold them.
    for name in [n for n in sys.modules if n in _HARNESS_EXTENSIONS or n.startswith("msgpack")]:
        del sys.modules[name]
    sys.stdin = sys.__stdin__ = fresh.stdin  # type: ignore[misc]
    sys.stdout = sys.__stdout__ = fresh.stdout  # type: ignore[misc]
    sys.stderr = sys.__stderr__ = fresh.stderr  # type: ignore[misc]
    atexit._clear()
    sys.argv = ["-c"]
    if not sys.path or sys.path[0] != "":
        sys.path.insert(0, "")  # like `python -c`: the snippet may import from its cwd
    sys.modules["__main__"] = fresh.main
    logging = sys.modules.get("logging")
    if logging is not None:  # configured by the zygote for its own lines: unconfigure
        for handler in logging.root.handlers[:]:
            logging.root.removeHandler(handler)
        logging.root.setLevel(logging.WARNING)


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


def finish(code: int, last_words: Callable[[], object] | None = None) -> NoReturn:
    """End the interpreter as Python's own exit does (finalization.py), tell the
    supervisor, and exit with ``code`` (120 when flushing stdout or stderr failed); a
    negative code ends the process by that signal, as Python does after an unhandled
    KeyboardInterrupt. ``last_words``: called once the interpreter is ended (a notebook's
    last record, which holds what its end printed)."""
    code = finalization.finalize(code, installed)
    if last_words is not None:
        last_words()
    if done_notice is not None:
        done_notice(code)
    if code < 0:
        _signal.signal(-code, _signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        code = 128 - code  # a PID namespace's init outlives its own signal: its notice said it
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
    """Execute ``source`` as ``__main__`` and end the process as ``python -c`` would.

    Call :func:`prepare` first (fork mode does so while waiting for the request).
    rich: tracebacks show source lines and markers.
    """
    sys.orig_argv = [*sys.orig_argv[:1], "-B", "-c", os.fsdecode(source)]
    if rich:
        remember_source(FILENAME, source)
    try:
        source.decode("utf-8")
    except UnicodeDecodeError:
        # What ``python -c`` says of a command that is no UTF-8 (a lone surrogate the
        # client passed through): its argv, decoded with surrogateescape, re-encoded.
        code = _undecodable(source)
    else:
        # The snippet is its PID namespace's init (with namespaces): signals with the
        # default action end it as they end any process (_nativechild.arm_stand_ins;
        # armed in its zygote already, but for spawn mode's fresh interpreter).
        _arm_stand_ins(True)
        code = run_main(source, sys.modules["__main__"].__dict__, auto_print=auto_print, rich=rich)
    exit_as_python(code)


def exit_as_python(code: int, last_words: Callable[[], object] | None = None) -> NoReturn:
    """End this process as Python's own exit after the main module does, with ``code``
    (run_main's): a snippet's first process, and any process a context call or a
    notebook cell forked once its copy of the code is done."""
    try:
        finish_threads_and_atexit()
    except BaseException as exc:  # as Python's own exit reports it: and goes on
        sys.stderr.write("Exception ignored on threading shutdown:\n")
        sys.stderr.write(format_exception(exc, lambda _: True))
    finish(code, last_words)


def _undecodable(source: bytes) -> int:
    try:
        source.decode("utf-8", "surrogateescape").encode("utf-8")
    except UnicodeEncodeError as exc:
        finalization.write_stderr(
            "Unable to decode the command from the command line:\n"
            + "".join(__import__("traceback").format_exception_only(type(exc), exc))
        )
    return 1


def run_main(source: bytes, namespace: dict[str, Any], *, auto_print: bool, rich: bool) -> int:
    """Run ``source`` in ``namespace``: its exit code (minus SIGINT after an unhandled
    KeyboardInterrupt), its unhandled error printed."""
    try:
        try:
            # As text, as ``python -c`` compiles its command: a coding cookie is ignored
            # and a BOM is a character.
            text: str | bytes = source
            try:
                text = source.decode("utf-8")
            except UnicodeDecodeError:
                pass
            body, tail = compile_snippet(text, auto_print=auto_print)
        except (SyntaxError, ValueError) as exc:
            if isinstance(exc, ValueError):  # NUL bytes on some Python versions
                exc = SyntaxError(str(exc))
            raise exc from None
        evaluate(body, namespace)
        if tail is not None:
            value = evaluate(tail, namespace)
            if value is not None:
                print(repr(value))
    except SystemExit as exc:
        return finalization.exit_status(exc.code)
    except BaseException as exc:
        status = print_exception(exc, rich=rich)
        if status is not None:
            return status
        # Python's exit by SIGINT is for KeyboardInterrupt itself, not its subclasses.
        return -_signal.SIGINT if type(exc) is KeyboardInterrupt else 1
    return 0


def evaluate(code: types.CodeType, namespace: dict[str, Any]) -> Any:
    """``code``'s value, run with no frame of the harness below it where the C module
    can (_nativechild.run_main)."""
    if _evaluate is not None:
        return _evaluate(code, namespace)
    return eval(code, namespace)


def _exit_code(exc: SystemExit) -> int:
    """The status ``exc`` ends the process with (finalization.exit_status)."""
    return finalization.exit_status(exc.code)


_MISSING = object()
_HARNESS_EXTENSIONS = ("codepool.worker.engine._nativechild",)


def print_exception(exc: BaseException, *, rich: bool, filename: str = FILENAME) -> int | None:
    """As Python prints an unhandled error: through ``sys.excepthook``, from the
    snippet's first frame (the first in ``filename``; a notebook cell's own). ``rich``:
    with source lines and markers, unless the snippet set a hook of its own. Returns the
    exit status when the hook raised SystemExit (it ends the process there, as Python's
    does), else None."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != filename:
        tb = tb.tb_next
    exc.__traceback__ = tb  # what the interpreter's display shows, whatever it is passed
    # As PyErr_Print: what pdb.pm() reads (a context's next call; an atexit hook).
    sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, tb
    if sys.version_info >= (3, 12):
        sys.last_exc = exc
    hook = getattr(sys, "excepthook", _MISSING)
    if hook is _MISSING:
        finalization.write_stderr("sys.excepthook is missing\n")
        sys.__excepthook__(type(exc), exc, tb)
        return None
    if rich and hook is sys.__excepthook__ and getattr(sys, "stderr", None) is not None:
        sys.stderr.write(_with_suggestion(format_exception(exc, filename.__eq__), exc, tb))
        return None
    try:
        hook(type(exc), exc, tb)  # type: ignore[operator]
    except BaseException as failed:  # worded as Python words it
        if isinstance(failed, SystemExit):
            return finalization.exit_status(failed.code)
        # As Python calls the hook: from no frame of the harness's, handling nothing.
        failed_tb = failed.__traceback__
        failed.__traceback__ = failed_tb.tb_next if failed_tb is not None else None
        if failed.__context__ is exc:
            failed.__context__ = None
        finalization.write_stderr("Error in sys.excepthook:\n")
        sys.__excepthook__(type(failed), failed, failed.__traceback__)
        finalization.write_stderr("\nOriginal exception was:\n")
        sys.__excepthook__(type(exc), exc, tb)
    return None


def _with_suggestion(text: str, exc: BaseException, tb: types.TracebackType | None) -> str:
    """``text`` (the traceback module's) with the last line the interpreter prints,
    where that says "Did you mean" and the module does not (before Python 3.12)."""
    if sys.version_info >= (3, 12) or not isinstance(exc, (NameError, AttributeError)):
        return text
    said = io.StringIO()
    stderr, sys.stderr = sys.stderr, said
    try:
        sys.__excepthook__(type(exc), exc, tb)
    finally:
        sys.stderr = stderr
    head, _, _ = text.rstrip("\n").rpartition("\n")
    last = said.getvalue().rstrip("\n").rpartition("\n")[2]
    return f"{head}\n{last}\n" if head else f"{last}\n"
