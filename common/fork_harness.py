"""The in-sandbox half of ``run_tests`` (common/reward_tests.py): one snippet that loads
a candidate program once and runs each test case in a copy-on-write fork of it.

This file's source is the snippet's code, so it runs on the worker's interpreter with
the standard library alone and never imports codepool. Three kinds of process:

- the harness (this module's ``main``) never runs user code and alone decides every
  verdict, from what it captured itself: the case's stdout and stderr through pipes it
  reads, its exit status, its own clock. It is made non-dumpable (no /proc/<pid>/fd,
  mem or ptrace for the rest of the sandbox) and the reaper of every orphan below it;
  it keeps the result lines in memory and writes the results file (read back with
  ``fetch_files``) only at its end, after it has killed and reaped every process it
  started and every process they started, so nothing is left to touch the file;
- the template runs ``prefix + candidate`` once, with stdin a pipe nobody writes (a
  program that reads stdin, or fails, or does not finish loading within a test's
  timeout, is no template: every test then runs as a plain run), and forks one test
  child per test on the harness's word (over a socket that carries the case's stdin,
  stdout and stderr fds, and brings back the child's pid and wait status). It holds
  no fd of the harness but that socket;
- a test child runs the test's code in the template's ``__main__`` with fds 0-2 the
  case's and every other fd closed, and ends as ``python -c`` would (exit code,
  traceback on stderr, atexit, threads joined).

A plain run is a child of the harness (wired the same way) that runs the whole program
``prefix + candidate + "\\n\\n" + code``, exactly what one ``run_code`` per test runs.
A test runs plain when its code does not stand alone (it does not compile by itself,
or a ``__future__`` import is involved) or when the template is gone (a test killed
it: that test is run again, plain). Line numbers in a forked test's traceback are
those of the whole program: the test's code is compiled after as many blank lines as
the program has before it. A forked test's stdout and stderr start with what the load
printed.

A test's wall clock is its ``timeout_s`` less the time the load took (a plain run pays
both within one timeout). Each test's process group is killed when it ends, before its
pipes are read to their end. The harness starts no test it cannot finish within
``budget_s`` (the snippet's own timeout): the client runs what was left in another.
"""

from __future__ import annotations

import gc
import json
import os
import select
import signal
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

# In the snippet, harness_procs.py's source stands in for this import (reward_tests.py).
from codepool.common.harness_procs import (  # harness: inlined
    CHUNK,
    DIGEST_TAG,
    _Children,
    _Control,
    _end_descendants,
    _finish,
    _fresh_main,
    _is_case,
    _kill_group,
    _own_group,
    _prctl,
    _publish,
    _status_fields,
    _StdinGuard,
    _still_running,
    _Tail,
    _wire,
    digest,
)

SPEC_PATH = ".codepool_tests.json"
RESULTS_PATH = ".codepool_results.jsonl"
FILENAME = "<sandbox>"
BUDGET_MARGIN_S = 0.5  # kept in hand for the harness's own end
LOAD_MARGIN_S = 0.05  # a load within this of the timeout makes no template
MAX_TEMPLATES = 3  # templates a harness makes before the rest of its tests run plain


class Harness:
    """One harness run over the spec (see module docstring)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.head: str = spec["prefix"] + spec["candidate"] + "\n\n"
        self.cases: list[dict[str, Any]] = spec["cases"]
        self.timeout_s = float(spec["timeout_s"])
        self.keep = int(spec["max_output_chars"]) * 4
        self.use_fork = bool(spec.get("fork", True))
        self.started = time.monotonic()
        self.deadline = self.started + float(spec["budget_s"]) - BUDGET_MARGIN_S
        self.children = _Children()
        self.head_code: Any = None
        self.case_codes: list[Any] = []
        self.compiled: dict[str, Any] = {}
        self.pad = "\n" * self.head.count("\n")
        self.lines: dict[int, dict[str, Any]] = {}
        self.out: int | None = None

    # -- the run ------------------------------------------------------------------------

    def run(self) -> None:
        self.case_codes = self._compile_cases() if self.use_fork else [None] * len(self.cases)
        templates = 0
        index = 0
        while index < len(self.cases):
            if index and not self._has_time():
                break  # left for the client to run in another snippet
            if self.case_codes[index] is None or templates >= MAX_TEMPLATES:
                self._plain(index)
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
            self._plain(left[0])
            index = left[0] + 1

    def results(self) -> bytes:
        return b"".join(json.dumps(line).encode() + b"\n" for line in self.lines.values())

    def _has_time(self) -> bool:
        return time.monotonic() + self.timeout_s <= self.deadline

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

    def _stdin(self, index: int) -> int:
        """A fd of case ``index``'s stdin that no path reaches (a memfd)."""
        text = self.cases[index].get("stdin")
        if text is None:
            return os.open(os.devnull, os.O_RDONLY)
        fd = os.memfd_create("stdin", 0)
        os.write(fd, text.encode("utf-8"))
        os.lseek(fd, 0, os.SEEK_SET)
        return fd

    def _watch(
        self, tails: dict[int, _Tail], until: float, ended: Callable[[], bool], wake: list[int]
    ) -> bool:
        """Read the pipes into ``tails`` until ``ended()`` (True) or ``until`` (False)."""
        reading = list(tails)
        while not ended():
            left = until - time.monotonic()
            if left <= 0:
                return False
            step = left if wake else min(left, 0.002)
            for fd in select.select(reading + wake, [], [], step)[0]:
                if fd in tails and not self._read(fd, tails[fd]):
                    reading.remove(fd)
        return True

    @staticmethod
    def _read(fd: int, tail: _Tail) -> bool:
        try:
            chunk = os.read(fd, CHUNK)
        except BlockingIOError:
            return True
        except OSError:
            chunk = b""
        tail.add(chunk)
        return bool(chunk)

    def _drain(self, tails: dict[int, _Tail]) -> None:
        """What the case's pipes hold once its group is dead; then they are closed (a
        process that escaped the group writes to no one)."""
        for fd, tail in tails.items():
            for _ in range(64):
                if not select.select([fd], [], [], 0)[0] or not self._read(fd, tail):
                    break
            os.close(fd)

    def _pipes(self, start: tuple[_Tail, _Tail] | None = None) -> tuple[dict[int, _Tail], int, int]:
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        tails = {
            out_r: _Tail(self.keep, start and start[0]),
            err_r: _Tail(self.keep, start and start[1]),
        }
        return tails, out_w, err_w

    def _record(
        self, index: int, status: int | None, took_s: float, mode: str, tails: dict[int, _Tail]
    ) -> None:
        out, err = tails.values()
        line = {"i": index, "mode": mode, "exec_s": took_s, "stdout": out.text()}
        line.update(stderr=err.text(), stdout_bytes=out.total, stderr_bytes=err.total)
        line.update(_status_fields(status))
        self.lines[index] = line
        self.publish(index)

    def publish(self, index: int) -> None:
        """Case ``index``'s line in the results file, and its digest on the harness's
        stdout, which no other process holds: the client takes a line only if its
        digest is there, so a line another process wrote counts for nothing."""
        data = json.dumps(self.lines[index]).encode() + b"\n"
        if self.out is None:
            self.out = os.open(RESULTS_PATH, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.write(self.out, data)
        os.write(1, b"%s %d %s\n" % (DIGEST_TAG, index, digest(data).encode()))

    # -- plain runs ------------------------------------------------------------------------

    def _plain(self, index: int) -> None:
        source = self.head + (self.cases[index].get("code") or "")
        if source not in self.compiled:  # stdin/stdout tests share one program
            try:
                self.compiled[source] = compile(source, FILENAME, "exec", dont_inherit=True)
            except (SyntaxError, ValueError) as exc:
                self.compiled[source] = exc
        code_obj = self.compiled[source]
        stdin_fd = self._stdin(index)
        tails, out_w, err_w = self._pipes()
        started = time.monotonic()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child ends in os._exit
            try:
                _own_group()
                _wire(stdin_fd, out_w, err_w)
                sys.stdin = open(0, encoding="utf-8", closefd=False)
                sys.stdout = open(1, "w", encoding="utf-8", closefd=False)
                sys.stderr = open(
                    2, "w", encoding="utf-8", errors="backslashreplace", closefd=False
                )
                namespace = _fresh_main()
                if isinstance(code_obj, BaseException):
                    sys.excepthook(type(code_obj), code_obj.with_traceback(None), None)
                    sys.stderr.flush()
                    os._exit(1)
                _finish(code_obj, namespace)
            finally:
                os._exit(121)
        for fd in (stdin_fd, out_w, err_w):
            os.close(fd)
        try:
            os.setpgid(pid, pid)
        except OSError:
            pass
        try:
            wake = [os.pidfd_open(pid)]
        except (AttributeError, OSError):
            wake = []

        def ended() -> bool:
            self.children.reap()
            return pid in self.children.ended

        done = self._watch(tails, started + self.timeout_s, ended, wake)
        took_s = time.monotonic() - started
        _kill_group(pid)
        if not done:
            self.children.wait(pid, 5.0)
        status = self.children.ended.pop(pid, None) if done else None
        self.children.ended.pop(pid, None)
        for fd in wake:
            os.close(fd)
        self._drain(tails)
        self._record(index, status, took_s, "plain", tails)

    # -- the template and its forks ----------------------------------------------------------

    def _forked(self, run: list[int]) -> list[int]:
        """Cases ``run`` in forks of a template that loads the program once; the cases
        it left (all of them when the program makes no template; from the one it was
        on when it died; those it had no time for)."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        tails, out_w, err_w = self._pipes()
        started = time.monotonic()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the template ends in os._exit
            try:
                _own_group()
                hold_r, _hold_w = os.pipe()  # stdin nobody writes: a read blocks the load
                _wire(hold_r, out_w, err_w, keep=theirs.fileno())
                self._template(theirs)
            finally:
                os._exit(0)
        for fd in (out_w, err_w):
            os.close(fd)
        theirs.close()
        control = _Control(mine)

        def loaded() -> bool:
            control.poll()
            return control.ready or control.gone

        load_s = max(0.0, self.timeout_s - LOAD_MARGIN_S)
        ready = self._watch(tails, started + load_s, loaded, [mine.fileno()]) and control.ready
        self._drain(tails)
        left = run
        if ready:
            load = tuple(tails.values())
            case_timeout_s = max(0.0, self.timeout_s - (time.monotonic() - started))
            for position, index in enumerate(run):
                if position and not self._has_time():
                    left = run[position:]
                    break
                if not self._fork_case(index, control, pid, case_timeout_s, load):
                    left = run[position:]
                    break
            else:
                left = []
        _kill_group(pid)
        self.children.wait(pid, 5.0)
        mine.close()
        return left

    def _fork_case(
        self, index: int, control: _Control, template: int, timeout_s: float, load: Any
    ) -> bool:
        """Case ``index`` in a fork of the template; False if the template went first."""
        stdin_fd = self._stdin(index)
        tails, out_w, err_w = self._pipes(load)
        started = time.monotonic()
        try:
            socket.send_fds(control.sock, [b"%d" % index], [stdin_fd, out_w, err_w])
        except OSError:
            control.gone = True
        for fd in (stdin_fd, out_w, err_w):
            os.close(fd)

        def ended() -> bool:
            control.poll()
            return (b"E", index) in control.said or control.gone

        self._watch(tails, started + timeout_s, ended, [control.sock.fileno()])
        took_s = time.monotonic() - started
        case = control.said.get((b"P", index))
        if _is_case(case, (template, os.getpid())):
            _kill_group(int(case))  # type: ignore[arg-type]
        self._drain(tails)
        status = control.said.get((b"E", index))
        if status is None and control.gone:
            return False
        self._record(index, status, took_s, "fork", tails)
        return True

    def _template(self, control: socket.socket) -> None:
        sys.stdout = open(1, "w", encoding="utf-8", closefd=False)
        sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)
        sys.stdin = _StdinGuard()  # says when it is touched
        namespace = _fresh_main()
        # What the template needs after the load; a load that replaced any of them
        # (monkeypatched os, builtins) makes no template: its tests run plain.
        needed = _harness_needs()
        try:
            exec(self.head_code, namespace)
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:
            os._exit(0)
        if _StdinGuard.touched or _harness_needs() != needed or _still_running():
            os._exit(0)
        gc.freeze()  # the forks then copy fewer pages
        # No handler of the load's runs in the template between cases (a case that
        # signals its parent would run it there): signals wait, and each case gets
        # the load's mask back.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        control.sendall(b"R")
        while True:
            message, fds, _, _ = socket.recv_fds(control, 64, 3)
            if not message or len(fds) != 3:
                os._exit(0)
            index = int(message)
            pid = os.fork()
            if pid == 0:  # the case: fds 0-2 its own, nothing else open
                try:
                    _own_group()
                    _wire(*fds)
                    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
                    sys.stdin = open(0, encoding="utf-8", closefd=False)
                    _finish(self.case_codes[index], namespace)
                finally:
                    os._exit(121)
            try:
                os.setpgid(pid, pid)
            except OSError:
                pass
            for fd in fds:
                os.close(fd)
            control.sendall(b"P %d %d" % (index, pid))
            control.sendall(b"E %d %d" % (index, os.waitpid(pid, 0)[1]))


def _harness_needs() -> list[int]:
    """Who the functions the template calls after the load are (by id)."""
    functions: list[object] = [os.fork, os.waitpid, os.dup2, os.close, os.closerange]
    functions += [os.setpgid, socket.recv_fds, socket.socket.sendall, open, exec]
    return [id(function) for function in functions]


def main() -> None:
    _prctl(4, 0)  # PR_SET_DUMPABLE 0: no /proc/<pid>/fd, mem or ptrace of the harness
    _prctl(36, 1)  # PR_SET_CHILD_SUBREAPER: orphans below come to the harness
    with open(SPEC_PATH, encoding="utf-8") as f:
        spec = json.load(f)
    os.unlink(SPEC_PATH)  # the program under test does not get to read its tests
    harness = Harness(spec)
    try:
        harness.run()
    finally:
        _end_descendants()  # nothing is left to touch the file once it is written anew
        _publish(RESULTS_PATH, harness.results())


if __name__ == "__main__":
    main()
