"""An interpreter context inside the sandbox: a child that keeps its ``__main__``
between calls and forks copy-on-write.

Process layout. The supervisor has the heavy zygote clone a child as for a snippet
(same namespaces, uid, Landlock, seccomp, rlimits) and sends it a context request. That
child becomes the family's *reaper* (R): it forks the first *interpreter* (I) and from
then on only reaps, never running user code. Why not let the child be the interpreter
itself: with a PID namespace the child is the namespace's init, and when init exits the
kernel kills everything in the namespace, so closing the first context would kill every
fork made from it. With R as init (or, without a PID namespace, as child subreaper), any
context of the family can end and the rest live on. A fork is made with
``clone(CLONE_PARENT)``, so every interpreter of the family is R's child: R reaps each
and reports its wait status and rusage on the done pipe (context_wire.REAPED), which is
how the supervisor learns that a context died of the CPU limit or a signal though the
context is not its own child. The supervisor kills R when the family's last context has
ended; with a PID namespace that takes anything a call detached along with it.

Calls. An interpreter reads orders on its control socket (fd 3). A call runs in the
process's one ``__main__`` with runtime.run_main (so tracebacks, auto-print and exit codes
are exactly a snippet's), under a CPU limit moved to "used so far + the call's CPU
seconds" (the hard limit stays open so the next call can move it again), then flushes
and answers ``E``. Its output files are the context's own memfds, which the supervisor
reads and empties after each call, so each call's stdout and stderr are its own, cut to
the output cap with a snippet's truncation marker, and the file size limit applies per
call.

Spares. After answering a fork order, unless its next order is already waiting, an
interpreter forks one more copy of itself that waits; its next fork order hands that
copy the new fork's fds instead of forking on the order's path, and a call ends it
first (context_spare.py says why that copy is the same state and what it costs).

Work dirs. Each interpreter works in ``ctx-<pid>`` under the child's work dir (the one
place Landlock lets it write besides the private tmpfs); a fork copies its parent's dir
into its own and moves there. Whoever reaps an interpreter (R) removes its dir, so a
context ended by a timeout, TTL or kill leaves none; the family's work dir and tmpfs go
with the family. Only the work dir forks: other paths in the family's private /tmp are
shared by its contexts (README).
"""

from __future__ import annotations

import os
import resource
import select
import shutil
import socket
import struct
import sys
from typing import NoReturn

from codepool.common.autoprint import FILENAME
from codepool.worker.engine import context_spare, context_wire, contract, linux, runtime
from codepool.worker.engine.contract import DONE_FD, REQUEST_FD

CLONE_PARENT = 0x00008000
PR_SET_CHILD_SUBREAPER = 36
DIR_PREFIX = "ctx-"
MAX_FORKS = context_wire.MAX_FORKS_PER_ORDER


def serve(reseed: object) -> NoReturn:
    """In the cloned child, once its limits are set and it said ready: become the
    family's reaper and start the first interpreter. ``reseed``: a callable that
    reseeds the random generators (child._reseed), run in every fork."""
    linux.prctl(PR_SET_CHILD_SUBREAPER, 1)
    root = os.getcwd()
    _flush()
    pid = os.fork()
    if pid == 0:
        os.close(DONE_FD)
        _Interpreter(root, reseed).serve()
    os.close(REQUEST_FD)  # the control socket is the interpreter's alone
    _reap_all(root)


def _reap_all(root: str) -> NoReturn:
    while True:
        try:
            pid, status, usage = os.wait4(-1, 0)
        except ChildProcessError:
            os._exit(0)
        except InterruptedError:
            continue
        shutil.rmtree(os.path.join(root, f"{DIR_PREFIX}{pid}"), ignore_errors=True)
        cpu_us = round((usage.ru_utime + usage.ru_stime) * 1e6)
        record = context_wire.REAPED.pack(pid, status, cpu_us, usage.ru_maxrss)
        try:
            os.write(DONE_FD, record)
        except OSError:
            pass  # the supervisor is gone or slow: it kills the family either way


class _Interpreter:
    def __init__(self, root: str, reseed: object) -> None:
        self.root = root
        self.reseed = reseed
        self.control = socket.socket(fileno=REQUEST_FD)
        self.main = sys.modules["__main__"].__dict__
        _ORIGINAL[:] = [sys.stdout, sys.stderr]
        self.spare = context_spare.Spare()
        self._enter_dir(None)

    def serve(self) -> NoReturn:
        self._say(context_wire.HELLO, os.getpid())
        while True:
            try:
                # A fork order's fds ride on its first byte: read with room for them.
                kind, fds, _, _ = socket.recv_fds(self.control, 1, 3 * MAX_FORKS)
            except OSError:
                kind, fds = b"", []
            if kind == context_wire.CALL and not fds:
                self.spare.drop()  # the call changes the state the spare copied
                self._answer_call()
                continue
            if kind == context_wire.FORK:
                try:
                    self._fork(fds)
                    continue
                except (OSError, struct.error):
                    pass
            for fd in fds:
                os.close(fd)
            # End of file (closed), a cut order or one it does not know: end.
            self._exit(0)

    def _answer_call(self) -> None:
        """Run a call and answer it. Whatever stops the answer (the call closed or
        replaced fd 3, a cut order) ends the context with a failure, never as a close:
        the call must not come back ``ok`` for want of an answer."""
        try:
            self._call()
        except Exception as exc:  # the call's process cannot go on serving: say why
            why = f"the context could not answer its call: {type(exc).__name__}: {exc}\n"
            try:
                os.write(2, why.encode("utf-8", "backslashreplace"))
            except OSError:
                pass
            self._exit(1)

    def _exit(self, code: int) -> NoReturn:
        shutil.rmtree(self.dir, ignore_errors=True)
        os._exit(code)

    def _call(self) -> None:
        cpu_s, flags, code_len, token = context_wire.CALL_HEAD.unpack(
            self._read(context_wire.CALL_HEAD.size)
        )
        code = self._read(code_len)
        if len(code) != code_len:
            raise ValueError("the call's code was cut short")
        _reap_leftovers()
        before = _cpu_s()
        own = resource.getrusage(resource.RUSAGE_SELF).ru_utime
        own += resource.getrusage(resource.RUSAGE_SELF).ru_stime
        soft = int(own) + 1 + cpu_s
        hard = resource.getrlimit(resource.RLIMIT_CPU)[1]  # open, unless a call lowered it
        if hard != resource.RLIM_INFINITY:
            soft = min(soft, hard)
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
        rich = bool(flags & contract.FLAG_RICH_TRACEBACKS)
        if rich:
            runtime.remember_source(FILENAME, code)
        sys.orig_argv = [*sys.orig_argv[:1], "-B", "-c", os.fsdecode(code)]
        me = os.getpid()
        try:
            code.decode("utf-8")
        except UnicodeDecodeError:  # a lone surrogate: worded as python -c words it
            rc = runtime._undecodable(code)
        else:
            auto_print = bool(flags & contract.FLAG_AUTO_PRINT)
            rc = runtime.run_main(code, self.main, auto_print=auto_print, rich=rich)
        if os.getpid() != me:
            # A process the call forked, done with its copy of the code: it ends as it
            # would under ``python -c``; only the interpreter answers the call.
            runtime.exit_as_python(rc)
        _flush()
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        self._say(context_wire.ENDED, token, rc, round((_cpu_s() - before) * 1e6), rss)

    def _fork(self, fds: list[int]) -> None:
        context_wire.FORK_HEAD.unpack(self._read(context_wire.FORK_HEAD.size))
        made = 0
        _flush()
        parent_dir = self.dir
        for number in range(len(fds) // 3):
            if number == 0 and self.spare.take(fds[:3]):
                made += 1  # the spare made after the last order is this fork
                continue
            try:
                pid = linux.fork_with_flags(CLONE_PARENT, hooks=True)
            except OSError:
                break  # the process limit: fewer forks, said in the answer
            if pid == 0:
                self._become_fork(fds, number, parent_dir)
                return  # this process now serves the fork's control socket
            made += 1
        for fd in fds:
            os.close(fd)
        self._say(context_wire.FORKED, made)
        # Off the order's path: the next fork order of this unchanged state is a hand-over.
        # At once, so a tight loop of forks finds it (waiting for a quiet moment first
        # measured no better and lost those); not when the next order is already here.
        if _order_waiting(self.control):
            return
        self.spare.make(
            lambda given: self._become_fork(given, 0, parent_dir, reseed=False),
            prepare=self._reseed,  # while it waits: one less thing on the order's path
        )

    def _become_fork(
        self, fds: list[int], number: int, parent_dir: str, *, reseed: bool = True
    ) -> None:
        control, out, err = fds[3 * number : 3 * number + 3]
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.dup2(control, REQUEST_FD)
        for fd in fds:
            os.close(fd)
        self.control.detach()
        self.control = socket.socket(fileno=REQUEST_FD)
        self._enter_dir(parent_dir)
        if reseed:
            self._reseed()
        self._say(context_wire.HELLO, os.getpid())

    def _reseed(self) -> None:
        if callable(self.reseed):
            self.reseed()

    def _enter_dir(self, copy_from: str | None) -> None:
        self.dir = os.path.join(self.root, f"{DIR_PREFIX}{os.getpid()}")
        if copy_from is None:
            os.mkdir(self.dir, 0o700)
        elif _empty(copy_from):
            # Most work dirs are: copytree would still walk and copystat, in a fresh
            # fork where every page that Python code touches is a copy-on-write fault.
            os.mkdir(self.dir, 0o700)
            os.chmod(self.dir, os.stat(copy_from).st_mode & 0o7777)
        else:
            shutil.copytree(copy_from, self.dir, symlinks=True)
        os.chdir(self.dir)

    def _read(self, size: int) -> bytes:
        data = bytearray()
        while len(data) < size:
            chunk = self.control.recv(size - len(data))
            if not chunk:
                return b""
            data += chunk
        return bytes(data)

    def _say(self, kind: bytes, *fields: int | bytes) -> None:
        self.control.sendall(kind + context_wire.BODIES[kind].pack(*fields))


def _reap_leftovers() -> None:
    """Reap what the last call left (the supervisor killed it at that call's end); the
    context's forks are the reaper's children, never waited for here."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _order_waiting(control: socket.socket) -> bool:
    poller = select.poll()
    poller.register(control, select.POLLIN)
    return bool(poller.poll(0))


def _empty(path: str) -> bool:
    with os.scandir(path) as entries:
        return next(entries, None) is None


def _cpu_s() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime


def _flush() -> None:
    """The streams, as an interactive interpreter flushes them after a statement, and
    the ones Python made (what was printed before the call rebound ``sys.stdout`` is
    this call's output, not a later one's)."""
    for name in ("stdout", "stderr", "__stdout__", "__stderr__"):
        try:
            getattr(sys, name).flush()
        except Exception:  # the user may have closed, replaced or deleted it
            pass
    for stream in _ORIGINAL:
        try:
            stream.flush()  # type: ignore[attr-defined]
        except Exception:
            pass


_ORIGINAL: list[object] = []  # the child's streams, as runtime.prepare installed them
