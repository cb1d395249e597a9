"""The supervisor's side of interpreter contexts: their bookkeeping, calls, forks,
deadlines, idle TTL and the cap on live contexts.

A context (context_child.py) is addressed by an id the supervisor gives out; clients
name it in ``ctx_call``/``ctx_fork``/``ctx_close`` (protocol.py), so a later router
(Redis, HTTP) only has to carry the id to the host that holds it. Orders on one context
run one at a time, in arrival order. A call takes one of the executor's slots only while
it runs: contexts waiting for their next call hold memory, not CPU. The caller keeps the
record of its successful calls (context.py), which is what a rebuild elsewhere replays.

A context ends, and says so (a ``ctx_ended`` message before the result that ended it),
when a call times out, reaches the CPU or memory limit or kills its process; when it
sits idle past the TTL; when its caller closes it or goes away. Ending one kills its
interpreter and whatever its calls left running, and nothing of its family else; its
work dir is removed by the family's reaper. When a family's last context has ended its
reaper is killed, which with a PID namespace takes anything detached with it. Calls on
an ended context come back ``rejected``, naming why it ended.
"""

from __future__ import annotations

import collections
import itertools
import logging
import os
import signal
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from codepool.common.limits import Limits
from codepool.common.result import rejected
from codepool.worker.engine import context_wire, contract, outcome

log = logging.getLogger(__name__)

_CREDS = struct.Struct("iII")  # struct ucred: pid, uid, gid
_GONE_REMEMBERED = 4096  # ended contexts whose reason a late call is still told
_KILL_PASSES = 3


@dataclass
class Op:
    kind: str  # "call" or "fork"
    client: Any  # supervisor.Client; None once it went away
    id: int
    received: float
    code: bytes = b""
    limits: Limits | None = None
    forks: int = 0


@dataclass
class Family:
    """The processes of one context and its forks: one sandbox (namespaces, uid), one
    reaper (the supervisor's child), one uid of the context block."""

    uid_index: int
    limits: Limits
    child: Any = None  # supervisor.Child of the reaper, once cloned
    members: dict[int, Ctx] = field(default_factory=dict)  # by namespace pid
    reaped: bytearray = field(default_factory=bytearray)
    exited: bool = False  # the reaper was waited for: its pid is no longer ours to kill


@dataclass
class Ctx:
    id: int
    client: Any
    family: Family
    sock: socket.socket | None
    out_fd: int
    err_fd: int
    answer: Op | None = None  # the open or fork order that waits for its hello
    ns_pid: int = 0
    host_pid: int = 0
    pidfd: int = -1
    buffer: bytearray = field(default_factory=bytearray)
    ops: collections.deque[Op] = field(default_factory=collections.deque)
    op: Op | None = None  # running now
    started: float = 0.0
    deadline: float | None = None
    timed_out: bool = False
    running: bool = False  # a call runs (and holds a slot)
    token: bytes = b""  # the running call's (context_wire.resync)
    last_active: float = field(default_factory=time.monotonic)
    ended: str | None = None
    exit_code: int | None = None  # from the reaper, once it reaped the interpreter
    new_forks: list[Ctx] = field(default_factory=list)  # of the fork order running
    forks_made: int | None = None


class ContextHost:
    """Owned by the supervisor. ``send(client, message)`` answers a client;
    ``clone(family)`` asks the heavy zygote for a family's first child; ``watch(fd,
    data)``/``unwatch(fd)`` (de)register with the supervisor's selector."""

    def __init__(
        self,
        *,
        max_contexts: int,
        ttl_s: float,
        send: Callable[[Any, dict[str, Any]], None],
        clone: Callable[[Family], None],
        watch: Callable[[Any, tuple[str, Any]], object],
        unwatch: Callable[[Any], object],
        pidns: bool = True,
    ) -> None:
        self.max_contexts = max_contexts
        self.pidns = pidns  # a family's reaper is its PID namespace's init
        self.ttl_s = ttl_s
        self._send, self._clone, self._watch, self._unwatch = send, clone, watch, unwatch
        self.contexts: dict[int, Ctx] = {}
        self.families: list[Family] = []
        # Twice the cap: a family's uid is free again only once its reaper was waited
        # for, a moment after its last context ended.
        self.free_uids = collections.deque(range(2 * max_contexts))
        self.ready: collections.deque[Ctx] = collections.deque()  # a call waits for a slot
        self.busy = 0  # calls running (each holds a slot)
        self._ids = itertools.count(1)
        self._gone: collections.OrderedDict[int, str] = collections.OrderedDict()

    # -- client orders ---------------------------------------------------------------

    def on_message(self, client: Any, message: dict[str, Any], limits: Limits | None) -> None:
        kind, now = message["t"], time.monotonic()
        request_id = message.get("id", 0)
        if kind == "ctx_open":
            assert limits is not None
            self._open(client, request_id, limits, now)
            return
        ctx = self.contexts.get(message.get("ctx", -1))
        if kind == "ctx_close":
            if ctx is not None:
                self._end(ctx, "closed by its caller", tell=False)
            return
        if ctx is None or ctx.ended is not None:
            reason = self._gone.get(message.get("ctx", -1), "no such context")
            if ctx is not None and ctx.ended is not None:
                reason = ctx.ended
            self._refuse(Op(kind, client, request_id, now), f"the context ended: {reason}")
            return
        if kind == "ctx_call":
            assert limits is not None
            ctx.ops.append(Op("call", client, request_id, now, message["code"], limits))
        else:
            wanted = int(message.get("n", 1))
            if not 1 <= wanted <= context_wire.MAX_FORKS_PER_ORDER:
                self._refuse(
                    Op("fork", client, request_id, now),
                    f"n must be 1 to {context_wire.MAX_FORKS_PER_ORDER}",
                )
                return
            ctx.ops.append(Op("fork", client, request_id, now, forks=wanted))
        self._advance(ctx)

    def _open(self, client: Any, request_id: int, limits: Limits, now: float) -> None:
        full = self._full(1)
        if full:
            self._refuse(Op("open", client, request_id, now), full)
            return
        family = Family(self.free_uids.popleft(), limits)
        self.families.append(family)
        ctx = Ctx(
            next(self._ids), client, family, None, -1, -1, Op("open", client, request_id, now)
        )
        self.contexts[ctx.id] = ctx
        family.members[0] = ctx  # until its hello says its pid
        self._clone(family)

    def _full(self, more: int) -> str:
        live = sum(1 for ctx in self.contexts.values() if ctx.ended is None)
        if more and not self.free_uids:
            return "every context uid is held by a family still being torn down: retry"
        if live + more > self.max_contexts:
            return (
                f"this executor holds {live} live contexts, its cap is {self.max_contexts}: "
                "close one (or raise max_contexts)"
            )
        return ""

    def drop_client(self, client: Any) -> None:
        for ctx in list(self.contexts.values()):
            if ctx.client is client:
                ctx.client = None
                self._end(ctx, "its caller went away", tell=False)

    # -- the family's first child ----------------------------------------------------

    def on_cloned(self, family: Family, child: Any, start_request: bytes) -> None:
        """The zygote cloned ``family``'s reaper-to-be: start it as a context."""
        family.child = child
        self._watch(child.done_fd, ("reaped", family))
        ctx = family.members.get(0)
        if ctx is None or ctx.ended is not None:  # given up on while it was cloned
            os.kill(child.pid, signal.SIGKILL)
            return
        ctx.sock = child.sock.dup()
        ctx.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        ctx.out_fd, ctx.err_fd = os.dup(child.out_fd), os.dup(child.err_fd)
        self._watch(ctx.sock, ("context", ctx))
        try:
            child.sock.sendall(start_request)
        except OSError:
            pass  # it died while set up: its exit ends the family

    def on_family_exit(self, family: Family, setup_error: str) -> None:
        """The reaper exited (killed once the family's last context ended, or died)."""
        self._read_reaped(family)
        family.exited = True
        self._unwatch(family.child.done_fd)
        os.close(family.child.done_fd)
        family.child.done_fd = -1
        for ctx in list(family.members.values()):
            if ctx.exit_code is None:
                ctx.exit_code = -signal.SIGKILL
            why = "its sandbox ended" if ctx.host_pid else f"it could not start: {setup_error}"
            self._died(ctx, why)
        self.families.remove(family)
        self.free_uids.append(family.uid_index)

    # -- events ----------------------------------------------------------------------

    def on_readable(self, ctx: Ctx) -> None:
        if ctx.sock is None:
            return
        try:
            data, ancdata, _, _ = ctx.sock.recvmsg(1 << 16, socket.CMSG_SPACE(_CREDS.size))
        except OSError:
            data, ancdata = b"", []
        if not data:
            self._on_eof(ctx)
            return
        sender = 0
        for level, kind, value in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                sender = _CREDS.unpack_from(value)[0]
        ctx.buffer += data
        if ctx.running and not context_wire.resync(ctx.buffer, ctx.token):
            return
        try:
            records = context_wire.parse(ctx.buffer)
        except ValueError as exc:
            log.error("context %d: %s; ending it", ctx.id, exc)
            self._end(ctx, "its control channel was garbled")
            return
        for record, fields in records:
            if record == context_wire.HELLO:
                self._on_hello(ctx, fields[0], sender)
            elif record == context_wire.ENDED and ctx.op is not None and ctx.op.kind == "call":
                if not ctx.timed_out and fields[0] == ctx.token:  # timed out: killed for it
                    self._finish_call(ctx, *fields[1:])
            elif record == context_wire.FORKED and ctx.op is not None and ctx.op.kind == "fork":
                ctx.forks_made = fields[0]
                self._check_forks(ctx)

    def _on_hello(self, ctx: Ctx, ns_pid: int, host_pid: int) -> None:
        if ctx.host_pid or not host_pid:
            return
        try:
            ctx.pidfd = os.pidfd_open(host_pid)
        except OSError:
            self._end(ctx, "its process could not be found")
            return
        ctx.ns_pid, ctx.host_pid = ns_pid, host_pid
        members = ctx.family.members
        if members.get(0) is ctx:
            del members[0]
        members[ns_pid] = ctx
        ctx.last_active = time.monotonic()
        answer, ctx.answer = ctx.answer, None
        if answer is not None and answer.kind == "open":
            self._send(answer.client, _made(answer.id, [ctx], ""))
        self._advance(ctx)
        self._check_fork_of(ctx)

    def on_reaped(self, family: Family) -> None:
        self._read_reaped(family)

    def _read_reaped(self, family: Family) -> None:
        try:
            family.reaped += os.read(family.child.done_fd, 1 << 16)
        except (BlockingIOError, OSError):
            return
        size = context_wire.REAPED.size
        while len(family.reaped) >= size:
            ns_pid, status, _, _ = context_wire.REAPED.unpack_from(family.reaped)
            del family.reaped[:size]
            ctx = family.members.get(ns_pid)
            if ctx is not None and ctx.host_pid:  # not a process a call left behind
                ctx.exit_code = os.waitstatus_to_exitcode(status)
                self._died(ctx, _death(ctx.exit_code))

    def _on_eof(self, ctx: Ctx) -> None:
        self._close_channel(ctx)
        if ctx.host_pid and ctx.exit_code is None:
            # The reaper says how it died, in a moment; its pidfd stays to kill it with
            # should it have only closed the socket. A running call may have closed it
            # itself: it ends as it ends (the interpreter exits 1, saying why) or at its
            # deadline, not by a kill that would read as a signal of its own.
            if not ctx.running:
                _signal(ctx.pidfd)
            return
        if ctx.ended is None:
            self._died(ctx, "it could not start")

    def _died(self, ctx: Ctx, why: str) -> None:
        """Its interpreter is gone (reaped or its family ended): finish what ran."""
        op = ctx.op
        if ctx.running and op is not None and op.limits is not None:
            code = ctx.exit_code if ctx.exit_code is not None else -signal.SIGKILL
            if ctx.timed_out:
                why = f"its call timed out after {op.limits.timeout_s:g} s"
            elif code in (-signal.SIGXCPU, -signal.SIGKILL):
                why = f"its call reached the CPU limit or was killed ({_death(code)[4:]})"
            self._end(ctx, why, before=lambda: self._finish_call(ctx, code, 0, 0))
            return
        self._end(ctx, ctx.ended or why)

    # -- orders ----------------------------------------------------------------------

    def _advance(self, ctx: Ctx) -> None:
        if ctx.op is not None or not ctx.ops or not ctx.host_pid or ctx.ended is not None:
            return
        op = ctx.ops.popleft()
        ctx.op = op
        if op.kind == "call":
            self.ready.append(ctx)
        else:
            self._start_fork(ctx, op)

    def queued_since(self) -> float | None:
        """When the oldest call that waits for a slot arrived."""
        while self.ready and (self.ready[0].ended is not None or self.ready[0].op is None):
            self.ready.popleft()
        return self.ready[0].op.received if self.ready and self.ready[0].op else None

    def start_next(self) -> None:
        """Start the oldest waiting call (the supervisor saw a free slot)."""
        ctx = self.ready.popleft()
        op = ctx.op
        assert op is not None and op.limits is not None and ctx.sock is not None
        flags = (contract.FLAG_AUTO_PRINT if op.limits.auto_print else 0) | (
            contract.FLAG_RICH_TRACEBACKS if op.limits.rich_tracebacks else 0
        )
        ctx.token = os.urandom(8)
        head = context_wire.CALL_HEAD.pack(op.limits.cpu_rlimit_s, flags, len(op.code), ctx.token)
        self.busy += 1
        ctx.running = True
        ctx.started = time.monotonic()
        ctx.deadline = ctx.started + op.limits.timeout_s
        try:
            ctx.sock.sendall(context_wire.CALL + head + op.code)
        except OSError:
            pass  # it died: the reaper's record finishes the call

    def _finish_call(self, ctx: Ctx, code: int, cpu_us: int, max_rss_kb: int) -> None:
        op = ctx.op
        assert op is not None and op.limits is not None
        ended = time.monotonic()
        self.busy -= 1
        ctx.running = False
        ctx.op, ctx.deadline = None, None
        if ctx.host_pid and ctx.ended is None:
            _kill_descendants(ctx.host_pid)  # what the call left running ends with it
        record = outcome.finished_record(
            out_fd=ctx.out_fd,
            err_fd=ctx.err_fd,
            limits=op.limits,
            returncode=code,
            timed_out=ctx.timed_out,
            cpu_s=cpu_us / 1e6,
            max_rss_kb=max_rss_kb,
            queue_s=ctx.started - op.received,
            exec_s=ended - ctx.started,
        )
        for fd in (ctx.out_fd, ctx.err_fd):  # the next call's output starts empty
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
        limit = record["limit"]
        ctx.last_active = ended
        if ctx.ended is None and limit in (outcome.MEMORY, outcome.CPU_TIME):
            self._end(ctx, f"its call reached the {limit} limit")
        self._send(op.client, {"t": "result", "id": op.id, "r": record})
        self._advance(ctx)

    def _start_fork(self, ctx: Ctx, op: Op) -> None:
        full = self._full(op.forks)
        if full or ctx.sock is None:
            ctx.op = None
            self._refuse(op, full or "the context ended")
            self._advance(ctx)
            return
        fds, ours = [], []
        for _ in range(op.forks):
            mine, theirs = socket.socketpair()
            mine.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            out = os.memfd_create("stdout", os.MFD_CLOEXEC)
            err = os.memfd_create("stderr", os.MFD_CLOEXEC)
            fork = Ctx(next(self._ids), op.client, ctx.family, mine, out, err, op)
            self.contexts[fork.id] = fork
            self._watch(mine, ("context", fork))
            ours.append(fork)
            fds += [theirs.fileno(), os.dup(out), os.dup(err)]
            theirs.detach()
        ctx.new_forks, ctx.forks_made = ours, None
        try:
            socket.send_fds(
                ctx.sock, [context_wire.FORK + context_wire.FORK_HEAD.pack(op.forks)], fds
            )
        except OSError:
            pass  # its death ends the order (_check_forks)
        for fd in fds:
            os.close(fd)

    def _check_fork_of(self, fork: Ctx) -> None:
        for parent in list(self.contexts.values()):
            if fork in parent.new_forks:
                self._check_forks(parent)
                return

    def _check_forks(self, ctx: Ctx) -> None:
        """Answer the fork order once every fork said hello or failed."""
        op = ctx.op
        if op is None or op.kind != "fork":
            return
        # Each fork says hello or, not made or dead at birth, closes its channel.
        if ctx.forks_made is None and ctx.ended is None:
            return
        if any(not f.host_pid and f.ended is None for f in ctx.new_forks):
            return
        made = [f for f in ctx.new_forks if f.host_pid and f.ended is None]
        for fork in ctx.new_forks:
            fork.answer = None
        error = "" if len(made) == op.forks else f"made {len(made)} of {op.forks} forks"
        self._send(op.client, _made(op.id, made, error))
        ctx.op, ctx.new_forks, ctx.forks_made = None, [], None
        ctx.last_active = time.monotonic()
        self._advance(ctx)

    # -- ending ----------------------------------------------------------------------

    def _end(
        self, ctx: Ctx, reason: str, *, tell: bool = True, before: Callable[[], None] | None = None
    ) -> None:
        """End ``ctx`` for ``reason`` (idempotent); ``before`` runs first once its
        processes are killed (the result of the call that ended it)."""
        if ctx.ended is None:
            ctx.ended = reason
            if ctx.host_pid and ctx.exit_code is None:
                _kill_descendants(ctx.host_pid)
                _signal(ctx.pidfd)
            if tell and ctx.client is not None:
                self._send(ctx.client, {"t": "ctx_ended", "ctx": ctx.id, "reason": reason})
        if before is not None:
            before()
        if ctx.running:
            return  # it finishes once the reaper reaped it (_died)
        if ctx in self.ready:
            self.ready.remove(ctx)
        if ctx.op is not None and ctx.op.kind == "fork":
            self._check_forks(ctx)
        if ctx.answer is not None and ctx.answer.kind == "open":
            self._refuse(ctx.answer, f"the context could not start: {reason}")
            ctx.answer = None
        elif ctx.answer is not None:  # a fork that failed: its order may be answered now
            self._check_fork_of(ctx)
        for op in [*([ctx.op] if ctx.op is not None else []), *ctx.ops]:
            self._refuse(op, f"the context ended: {reason}")
        ctx.op = None
        ctx.ops.clear()
        self._close_channel(ctx)
        if ctx.exit_code is not None or not ctx.host_pid:
            self._forget(ctx)

    def _forget(self, ctx: Ctx) -> None:
        if self.contexts.pop(ctx.id, None) is None:
            return
        self._gone[ctx.id] = ctx.ended or "ended"
        while len(self._gone) > _GONE_REMEMBERED:
            self._gone.popitem(last=False)
        for fd in (ctx.out_fd, ctx.err_fd, ctx.pidfd):
            if fd >= 0:
                os.close(fd)
        ctx.out_fd = ctx.err_fd = ctx.pidfd = -1
        family = ctx.family
        for key, member in list(family.members.items()):
            if member is ctx:
                del family.members[key]
        if family.child is None or family.exited:
            return
        if not any(m.ended is None for m in family.members.values()):
            # The last one: the reaper goes, and with it the family's namespaces.
            os.kill(family.child.pid, signal.SIGKILL)

    def _close_channel(self, ctx: Ctx) -> None:
        if ctx.sock is not None:
            self._unwatch(ctx.sock)
            ctx.sock.close()
            ctx.sock = None

    def _refuse(self, op: Op, reason: str) -> None:
        if op.kind == "call":
            self._send(op.client, {"t": "result", "id": op.id, "r": _rejected(reason)})
        else:
            self._send(op.client, _made(op.id, [], reason))

    # -- time ------------------------------------------------------------------------

    def expire(self, now: float) -> float | None:
        """Kill calls past their deadline and end contexts idle past the TTL; returns
        the seconds until the next such moment."""
        soonest: float | None = None
        for ctx in list(self.contexts.values()):
            if ctx.ended is not None or not ctx.host_pid:
                continue
            if ctx.deadline is not None:
                if ctx.deadline <= now:
                    ctx.timed_out, ctx.deadline = True, None
                    family = ctx.family
                    others = (m for m in family.members.values() if m is not ctx)
                    if not family.exited and not any(m.ended is None for m in others):
                        # The timeout ends the family's last context: end the family at
                        # once, its PID namespace with it, not process by process (a
                        # fork bomb outran that for half a minute), and answer now: the
                        # kernel's teardown of a namespace full of forks took 10-70 s.
                        os.kill(family.child.pid, signal.SIGKILL)
                        if self.pidns:
                            ctx.exit_code = -signal.SIGKILL
                            self._died(ctx, "")
                            continue
                    _kill_descendants(ctx.host_pid)
                    _signal(ctx.pidfd)
                    continue
                moment = ctx.deadline
            elif ctx.op is None and not ctx.ops:
                moment = ctx.last_active + self.ttl_s
                if moment <= now:
                    self._end(ctx, f"it was idle past its TTL of {self.ttl_s:g} s")
                    continue
            else:
                continue
            soonest = moment if soonest is None else min(soonest, moment)
        return None if soonest is None else max(0.0, soonest - now)

    def shutdown(self) -> list[Any]:
        """Kill every context; the reapers (supervisor children) to wait for."""
        for ctx in self.contexts.values():
            if ctx.host_pid:
                _kill_descendants(ctx.host_pid)
                _signal(ctx.pidfd)
        return [family.child for family in self.families if family.child is not None]


def _made(request_id: int, made: list[Ctx], error: str) -> dict[str, Any]:
    return {
        "t": "ctx",
        "id": request_id,
        "ctxs": [{"id": ctx.id, "pid": ctx.host_pid} for ctx in made],
        "error": error,
    }


def _rejected(reason: str) -> dict[str, Any]:
    return rejected(f"rejected: {reason}").to_dict()


def _death(code: int) -> str:
    if code < 0:
        return f"its process was killed by signal {-code} ({signal.Signals(-code).name})"
    return f"its process exited with code {code}"


def _signal(pidfd: int) -> None:
    if pidfd >= 0:
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except (ProcessLookupError, OSError):
            pass


def _children(pid: int) -> list[int]:
    found = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                found += [int(child) for child in f.read().split()]
    except OSError:
        pass
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def _kill_descendants(pid: int) -> None:
    """SIGKILL every live descendant of ``pid`` (the processes a call started; a
    context's forks are its reaper's children, not its own). A few passes, for what
    forked while the tree was read; what detached itself (a double fork) is its
    reaper's and dies with the family."""
    for _ in range(_KILL_PASSES):
        tree, stack = [], _children(pid)
        while stack:
            child = stack.pop()
            tree.append(child)
            stack += _children(child)
        alive = [child for child in tree if _alive(child)]
        if not alive:
            return
        for child in alive:
            try:
                os.kill(child, signal.SIGKILL)
            except OSError:
                pass
