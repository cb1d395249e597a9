"""The in-sandbox half of ``run_tests`` (common/reward_tests.py): one snippet that loads
a candidate program once and runs each test case in a copy-on-write fork of it.

This file's source is the snippet's code, so it runs on the worker's interpreter with
the standard library alone and never imports codepool. Three kinds of process:

- the harness (this module's ``main``) never runs user code: it reads the spec file,
  times every test, kills what overruns, and appends one JSON line per finished test
  to the results file (read back with ``fetch_files``, so a harness cut short still
  gives back what it finished);
- the template runs ``prefix + candidate`` once, with stdin closed to it (a program
  that reads stdin, or fails, or does not finish loading within a test's timeout, is
  no template: every test then runs as a plain run), and forks one test child per
  test on the harness's word;
- a test child runs the test's code in the template's ``__main__``, with the test's
  stdin and its own output files (which start with what the load printed), and ends
  as ``python -c`` would (exit code, traceback on stderr, atexit, threads joined).

A plain run is a child of the harness that runs the whole program
``prefix + candidate + "\\n\\n" + code``, exactly what one ``run_code`` per test runs.
A test runs plain when its code does not stand alone (it does not compile by itself,
or a ``__future__`` import is involved) or when the template is gone (a test killed
it: that test is run again, plain). Line numbers in a forked test's traceback are
those of the whole program: the test's code is compiled after as many blank lines as
the program has before it.

A test's wall clock is its ``timeout_s`` less the time the load took (a plain run pays
both within one timeout). Each test's process group is killed when it ends, so what it
left behind does not outlive it. The harness starts no test it cannot finish within
``budget_s`` (the snippet's own timeout): the client runs what was left in another.
"""

from __future__ import annotations

import gc
import json
import os
import select
import signal
import sys
import time
import types
from collections.abc import Callable
from typing import Any

SPEC_PATH = ".codepool_tests.json"
RESULTS_PATH = ".codepool_results.jsonl"
FILENAME = "<sandbox>"
BUDGET_MARGIN_S = 0.5  # kept in hand for the harness's own end
LOAD_MARGIN_S = 0.05  # a load within this of the timeout makes no template
MAX_TEMPLATES = 3  # templates a harness makes before the rest of its tests run plain
CHUNK = 1 << 16


class _NeedsStdin(BaseException):
    """Raised in the template when the program touches stdin while it loads."""


class _StdinGuard:
    touched = False

    def __getattr__(self, name: str) -> Any:
        _StdinGuard.touched = True
        raise _NeedsStdin("stdin is read while the program loads")


def _tail(path: str, max_chars: int) -> tuple[str, int]:
    """The last bytes of a file that can hold ``max_chars`` characters (a bounded read),
    as latin-1 text for JSON, and the file's size; the client decodes them."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - max_chars * 4))
            data = f.read(max_chars * 4)
    except OSError:
        return "", 0
    return data.decode("latin-1"), size


def _fresh_main() -> dict[str, Any]:
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    sys.argv = ["-c"]
    return main.__dict__


def _point_stdio(stdin_path: str | None, out_path: str, err_path: str, *, streams: bool) -> None:
    """fds 0-2 at the test's files; with ``streams``, emptied and with fresh sys streams
    on them (else the ones the load used, flushed before the fork, append to them)."""
    stdin_fd = os.open(stdin_path or os.devnull, os.O_RDONLY)
    os.dup2(stdin_fd, 0)
    os.close(stdin_fd)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | (os.O_TRUNC if streams else 0)
    for fd, path in ((1, out_path), (2, err_path)):
        opened = os.open(path, flags, 0o600)
        os.dup2(opened, fd)
        os.close(opened)
    sys.stdin = open(0, encoding="utf-8", closefd=False)
    if streams:
        sys.stdout = open(1, "w", encoding="utf-8", closefd=False)
        sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)


def _finish(code_obj: Any, namespace: dict[str, Any]) -> None:
    """Run ``code_obj`` in ``namespace`` and end the process as ``python -c`` would."""
    status = 0
    try:
        exec(code_obj, namespace)
    except SystemExit as exc:
        status = _exit_status(exc)
    except BaseException as exc:  # the program's: printed as Python prints it
        tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)
        status = 1
    try:
        threading = sys.modules.get("threading")
        if threading is not None:
            threading._shutdown()
        import atexit

        atexit._run_exitfuncs()
    except SystemExit as exc:
        status = _exit_status(exc)
    except BaseException:
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            status = status or 120
    os._exit(status)


def _exit_status(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        print(code, file=sys.stderr)
    except BaseException:
        pass
    return 1


class _Children:
    """The harness's children, reaped with whatever became its child meanwhile (the
    harness is the snippet's first process: orphans come to it)."""

    def __init__(self) -> None:
        self.ended: dict[int, int] = {}

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.ended[pid] = status

    def wait(self, pid: int, timeout_s: float) -> int | None:
        """The wait status of child ``pid``, or None if it runs past ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        try:
            pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            pidfd = -1
        try:
            while True:
                self.reap()
                if pid in self.ended:
                    return self.ended.pop(pid)
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                if pidfd >= 0:
                    select.select([pidfd], [], [], left)
                else:
                    time.sleep(min(left, 0.002))
        finally:
            if pidfd >= 0:
                os.close(pidfd)


def _own_group() -> None:
    """A process group of its own, where the sandbox allows it (its kill takes what the
    test started; else the snippet's end does)."""
    try:
        os.setpgid(0, 0)
    except OSError:
        pass


def _kill_group(pid: int) -> None:
    for kill in (os.killpg, os.kill):
        try:
            kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _status_fields(status: int | None) -> dict[str, Any]:
    if status is None:
        return {"rc": None, "sig": None, "timed_out": True}
    if os.WIFSIGNALED(status):
        return {"rc": -os.WTERMSIG(status), "sig": os.WTERMSIG(status), "timed_out": False}
    return {"rc": os.waitstatus_to_exitcode(status), "sig": None, "timed_out": False}


class Harness:
    """One harness run over the spec (see module docstring)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.head: str = spec["prefix"] + spec["candidate"] + "\n\n"
        self.cases: list[dict[str, Any]] = spec["cases"]
        self.timeout_s = float(spec["timeout_s"])
        self.max_chars = int(spec["max_output_chars"])
        self.use_fork = bool(spec.get("fork", True))
        self.started = time.monotonic()
        self.deadline = self.started + float(spec["budget_s"]) - BUDGET_MARGIN_S
        self.children = _Children()
        self.head_code: Any = None
        self.case_codes: list[Any] = []
        self.compiled: dict[str, Any] = {}
        self.pad = "\n" * self.head.count("\n")
        self.results: Any = None

    # -- the run ------------------------------------------------------------------------

    def run(self) -> None:
        for index, case in enumerate(self.cases):
            if case.get("stdin") is not None:
                with open(f".codepool_in_{index}", "w", encoding="utf-8") as f:
                    f.write(case["stdin"])
        self.case_codes = self._compile_cases() if self.use_fork else [None] * len(self.cases)
        self.results = open(RESULTS_PATH, "a", encoding="utf-8")
        templates = 0
        index = 0
        while index < len(self.cases):
            if index and not self._has_time():
                break  # left for the client to run in another snippet
            if self.case_codes[index] is None or templates >= MAX_TEMPLATES:
                self._write(self._plain(index))
                index += 1
                continue
            run = [index]  # the forkable cases from here: one template serves them
            while run[-1] + 1 < len(self.cases) and self.case_codes[run[-1] + 1] is not None:
                run.append(run[-1] + 1)
            templates += 1
            left = self._forked(run)
            if not left:
                index = run[-1] + 1
                continue
            if not self._has_time():
                break
            if left == run:  # no template (or it died at once): the rest run plain
                templates = MAX_TEMPLATES
            # The case the template was on when it went runs plain; a new template
            # takes the cases after it.
            self._write(self._plain(left[0]))
            index = left[0] + 1
        self.results.close()

    def _has_time(self) -> bool:
        return time.monotonic() + self.timeout_s <= self.deadline

    def _write(self, line: dict[str, Any]) -> None:
        self.results.write(json.dumps(line) + "\n")
        self.results.flush()

    def _compile_cases(self) -> list[Any]:
        if "__future__" in self.head:
            return [None] * len(self.cases)
        try:
            self.head_code = compile(self.head, FILENAME, "exec", dont_inherit=True)
        except (SyntaxError, ValueError):
            return [None] * len(self.cases)
        compiled: list[Any] = []
        for case in self.cases:
            code = case.get("code") or ""
            try:
                if "__future__" in code:
                    raise SyntaxError("__future__ imports run plain")
                compiled.append(compile(self.pad + code, FILENAME, "exec", dont_inherit=True))
            except (SyntaxError, ValueError):
                compiled.append(None)
        return compiled

    def _files(self, index: int) -> tuple[str | None, str, str]:
        stdin = f".codepool_in_{index}" if self.cases[index].get("stdin") is not None else None
        return stdin, f".codepool_out_{index}", f".codepool_err_{index}"

    def _outcome(self, index: int, status: int | None, took_s: float, mode: str) -> dict[str, Any]:
        _, out_path, err_path = self._files(index)
        stdout, stdout_bytes = _tail(out_path, self.max_chars)
        stderr, stderr_bytes = _tail(err_path, self.max_chars)
        for path in (out_path, err_path):
            try:
                os.unlink(path)
            except OSError:
                pass
        line = {"i": index, "mode": mode, "exec_s": took_s, "stdout": stdout, "stderr": stderr}
        line.update(stdout_bytes=stdout_bytes, stderr_bytes=stderr_bytes)
        line.update(_status_fields(status))
        return line

    def _run_child(
        self, index: int, child: Callable[[], None], timeout_s: float, mode: str
    ) -> dict[str, Any]:
        """Fork ``child`` for case ``index``, time it, kill its group; its result line."""
        started = time.monotonic()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child ends in os._exit
            try:
                _own_group()
                child()
            finally:
                os._exit(121)
        status = self.children.wait(pid, timeout_s)
        took_s = time.monotonic() - started
        _kill_group(pid)
        if status is None:
            self.children.wait(pid, 5.0)
        return self._outcome(index, status, took_s, mode)

    # -- plain runs ------------------------------------------------------------------------

    def _plain(self, index: int) -> dict[str, Any]:
        stdin_path, out_path, err_path = self._files(index)
        source = self.head + (self.cases[index].get("code") or "")
        if source not in self.compiled:  # stdin/stdout tests share one program
            try:
                self.compiled[source] = compile(source, FILENAME, "exec", dont_inherit=True)
            except (SyntaxError, ValueError) as exc:
                self.compiled[source] = exc
        code_obj = self.compiled[source]

        def child() -> None:
            _point_stdio(stdin_path, out_path, err_path, streams=True)
            namespace = _fresh_main()
            if isinstance(code_obj, BaseException):
                sys.excepthook(type(code_obj), code_obj.with_traceback(None), None)
                sys.stderr.flush()
                os._exit(1)
            _finish(code_obj, namespace)

        return self._run_child(index, child, self.timeout_s, "plain")

    # -- the template and its forks ----------------------------------------------------------

    def _forked(self, run: list[int]) -> list[int]:
        """Cases ``run`` in forks of a template that loads the program once; the cases
        it left (all of them when the program makes no template; from the one it was
        on when it died; those it had no time for)."""
        ready_r, ready_w = os.pipe()
        started = time.monotonic()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the template ends in os._exit
            try:
                os.close(ready_r)
                self._template(run, ready_w, started)
            finally:
                os._exit(0)
        os.close(ready_w)
        load_s = max(0.0, self.timeout_s - LOAD_MARGIN_S)
        ready = select.select([ready_r], [], [], load_s)[0]
        answer = os.read(ready_r, 8) if ready else b""
        os.close(ready_r)
        status = None
        if answer[:1] == b"R":  # loaded: it runs the cases, each within its timeout
            status = self.children.wait(pid, len(run) * (self.timeout_s + 1.0) + 5.0)
        if status is None:
            _kill_group(pid)
            self.children.wait(pid, 5.0)
        done = set()
        with open(RESULTS_PATH, encoding="utf-8") as f:
            for raw in f:
                try:
                    done.add(json.loads(raw)["i"])
                except (ValueError, KeyError, TypeError):
                    pass
        return [index for index in run if index not in done]

    def _template(self, run: list[int], ready_w: int, started: float) -> None:
        _own_group()
        _point_stdio(None, ".codepool_load_out", ".codepool_load_err", streams=True)
        # stdin: a pipe nobody writes, so a read of fd 0 blocks the load past its time;
        # sys.stdin says when it is touched.
        hold_r, _hold_w = os.pipe()
        os.dup2(hold_r, 0)
        sys.stdin = _StdinGuard()
        namespace = _fresh_main()
        # What the harness needs after the load; a load that replaced any of them
        # (monkeypatched os, builtins) makes no template: its tests run plain.
        needed = _harness_needs()
        try:
            exec(self.head_code, namespace)
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:
            os._exit(0)
        if _StdinGuard.touched or _harness_needs() != needed:
            os._exit(0)
        loaded = []
        for path in (".codepool_load_out", ".codepool_load_err"):
            with open(path, "rb") as f:
                loaded.append(f.read())
        gc.freeze()  # the forks then copy fewer pages
        os.write(ready_w, b"R")
        os.close(ready_w)
        case_timeout_s = max(0.0, self.timeout_s - (time.monotonic() - started))
        for index in run:
            if index != run[0] and not self._has_time():
                break

            def child(index: int = index) -> None:
                os.close(hold_r)
                stdin_path, out_path, err_path = self._files(index)
                for path, data in ((out_path, loaded[0]), (err_path, loaded[1])):
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                    os.write(fd, data)
                    os.close(fd)
                _point_stdio(stdin_path, out_path, err_path, streams=False)
                _finish(self.case_codes[index], namespace)

            self._write(self._run_child(index, child, case_timeout_s, "fork"))
        os._exit(0)


def _harness_needs() -> list[int]:
    """Who the functions the template calls after the load are (by id)."""
    functions: list[object] = [os.fork, os.read, os.write, os.waitpid, os.open, os.dup2]
    functions += [os.close, os.kill, os.killpg, os.unlink, os.fstat, select.select]
    functions += [time.monotonic, json.dumps, open, compile, exec]
    return [id(function) for function in functions]


def main() -> None:
    with open(SPEC_PATH, encoding="utf-8") as f:
        spec = json.load(f)
    os.unlink(SPEC_PATH)  # the program under test does not get to read its tests
    Harness(spec).run()


if __name__ == "__main__":
    main()
