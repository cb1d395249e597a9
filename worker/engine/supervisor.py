"""The supervisor: serves run requests, keeps deadlines, reaps children, sends results.

The executor starts it; it starts the zygotes (worker/engine/zygote.py; which one a
snippet goes to, bare, light, mid or heavy, is routing.py's) and asks them, over
SEQPACKET sockets, to clone children with ``CLONE_PARENT``: each child is the
supervisor's own, so the supervisor waits for it (wait4, rusage for free) and kills it.
This keeps the bookkeeping out of the big preloaded processes: a fork shares every page
of a zygote with the child, and every page the zygote then writes is copied again, so a
zygote does nothing but clone. At most ``concurrency`` snippets run at once; one more
child is always cloned and waiting so a request does not pay for the fork.

Run by the executor as ``python -P -B -m codepool.worker.engine.supervisor``, its
config (JSON) on stdin.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from codepool.common import codec
from codepool.common.errors import WireError
from codepool.common.limits import Limits
from codepool.common.reaping import wait_or_kill
from codepool.common.result import cancelled, infra, rejected
from codepool.common.snippet import Snippet
from codepool.worker.engine import (
    context_host,
    done,
    isolation,
    leftovers,
    native,
    outcome,
    readback,
    routing,
    shm,
)
from codepool.worker.engine.child import ChildRequest
from codepool.worker.engine.config import FALLBACK_PREFIX, ZygoteConfig, enter, send_config
from codepool.worker.engine.connection import Client
from codepool.worker.engine.contract import READY
from codepool.worker.engine.protocol import (
    CLONE_REPLY,
    CLONE_REQUEST,
    encode_frame,
)

log = logging.getLogger("codepool.worker.engine.supervisor")

# Snippet uids each supervisor may use: uid_base is spaced by this much per supervisor pid.
UID_BLOCK = 64
# Interpreter contexts get a uid per family from a block of their own, far above the
# snippets' (so max_contexts is at most half this).
CONTEXT_UID_BLOCK = 2048
CONTEXT_UID_BASE = 100_000_000
# What a stopping supervisor gives its clients' unsent results, all together (seconds).
EXIT_FLUSH_S = 1.0


@dataclass
class Request:
    client: Client | None
    id: int
    code: bytes
    limits: Limits
    received: float
    kind: str  # the zygote it goes to
    snippet: Snippet | None = None  # its inputs, when it has any


@dataclass
class Child:
    pid: int
    pidfd: int
    sock: socket.socket
    out_fd: int
    err_fd: int
    slot: int
    fallback_dir: str | None
    kind: str  # which zygote cloned it (one of routing.KINDS)
    done_fd: int  # the done pipe's read end (worker/engine/done.py), -1 once read
    request: Request | None = None
    started: float = 0.0
    deadline: float | None = None
    timed_out: bool = False
    notice: done.Notice | None = None  # its done notice, once it was killed at it
    reported: bool = False  # its result went out (at the notice, or at its exit)
    cancelled: bool = False  # killed because its client gave up: reported as cancelled
    ready: bool | None = None  # it said "ready" (None: not read yet)
    handed: list[int] = field(default_factory=list)  # the fds it sent with "ready"
    uid: int | None = None  # the uid it runs as (None: the worker's own)
    family: context_host.Family | None = None  # the reaper of an interpreter context family


class Supervisor:
    def __init__(
        self,
        config: ZygoteConfig,
        zygotes: dict[str, ZygoteHandle],
        owner: socket.socket,
    ) -> None:
        self.config = config
        self.zygotes = zygotes
        self.zygote = zygotes[routing.HEAVY]
        self.state = self.zygote.state
        self.report = self.zygote.report
        self.router = (
            routing.Router(
                config.preload,
                mid=routing.MID in zygotes,
                light=routing.LIGHT in zygotes,
                bare=routing.BARE in zygotes,
            )
            if len(zygotes) > 1
            else None
        )
        self.selector = selectors.DefaultSelector()
        self.queue: collections.deque[Request] = collections.deque()
        self.running: dict[int, Child] = {}
        self.dying: dict[int, Child] = {}  # cancelled and killed, not reaped yet
        self.warm_children = {kind: collections.deque[Child]() for kind in zygotes}
        self.cloning = {kind: collections.deque[Child]() for kind in zygotes}  # asked, no pid yet
        # One uid per slot: running ones plus the (up to two per zygote) waiting ones. Without a PID
        # namespace, what a snippet leaves (killed, but not yet reaped by init) still counts
        # against its uid's process limit: there the uids rotate through a whole block, so
        # a fork bomb's remains are long gone when its uid comes round again.
        slots = config.concurrency + 2 * len(zygotes)
        if not self.state.pidns and self.state.separate_uid:
            slots = max(slots, UID_BLOCK)
        self.free_slots = collections.deque(range(slots))
        self.uid_slots = slots
        self.uid_base = config.uid_base or 200_000 + (os.getpid() % 100_000) * UID_BLOCK
        # Without a PID namespace or uids of their own, nothing but this tells what
        # snippets left in the host's /dev/shm from the worker user's own files (shm.py).
        self.shm_sweep: shm.Sweep | None = None
        if not self.state.pidns and not self.state.separate_uid:
            self.shm_sweep = shm.Sweep(uid=os.geteuid())
        self.context_uid_base = CONTEXT_UID_BASE + (os.getpid() % 100_000) * CONTEXT_UID_BLOCK
        self.contexts = context_host.ContextHost(
            max_contexts=min(config.max_contexts, CONTEXT_UID_BLOCK // 2),
            ttl_s=config.context_ttl_s,
            send=self._send,
            clone=lambda family: self._request_clone(routing.HEAVY, family=family),
            watch=lambda fd, data: self.selector.register(fd, selectors.EVENT_READ, data),
            unwatch=self.selector.unregister,
            pidns=self.state.pidns,
        )
        self.stopping = False
        self._broken: list[Client] = []  # clients to drop (_sent)
        # Cleared when a waiting child dies during setup, so a host that refuses our
        # setup does not spin cloning children nobody asked for.
        self.prefork = True
        self._add_client(owner, owner=True)
        for kind, zygote in zygotes.items():
            self.selector.register(zygote.sock, selectors.EVENT_READ, ("zygote", kind))
        if config.listen_fd >= 0:
            self.listener: socket.socket | None = socket.socket(fileno=config.listen_fd)
            self.listener.set_inheritable(False)
            self.selector.register(self.listener, selectors.EVENT_READ, ("listener", None))

    # -- clients -------------------------------------------------------------------

    def _add_client(self, sock: socket.socket, *, owner: bool) -> None:
        sock.setblocking(False)
        client = Client(sock, owner)
        self.selector.register(sock, selectors.EVENT_READ, ("client", client))
        uids = [self.uid_base, self.uid_base + self.uid_slots] if self.state.separate_uid else None
        self._send(
            client,
            {
                "t": "hello",
                "pid": os.getpid(),
                "zygote_pids": [zygote.pid for zygote in self.zygotes.values()],
                "report": self.report,
                "mode": self.config.mode,
                "concurrency": self.config.concurrency,
                "uids": uids,
            },
        )

    def _accept(self) -> None:
        assert self.listener is not None
        try:
            sock, _ = self.listener.accept()
        except OSError as exc:
            log.warning("accept failed: %s", exc)
            return
        sock.set_inheritable(False)
        self._add_client(sock, owner=False)

    def _send(self, client: Client | None, message: dict[str, Any]) -> None:
        """Send ``message`` to ``client`` as far as its socket takes it now; the rest
        waits in its outbox (worker/engine/connection.py). Never waits."""
        if client is not None and not client.broken:
            self._sent(client, client.push(encode_frame(message)))

    def _sent(self, client: Client, alive: bool) -> None:
        """Watch a client for writability while its outbox holds something; a broken
        one is dropped at the top of the loop, not inside a handler that may be
        walking what a drop changes."""
        if not alive:
            self._broken.append(client)
            return
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if client.outbox else 0)
        if self.selector.get_key(client.sock).events != events:
            self.selector.modify(client.sock, events, ("client", client))

    def _on_client(self, client: Client) -> None:
        try:
            data = client.sock.recv(1 << 20)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop_client(client)
            return
        try:
            messages = client.reader.feed(data)
        except (ValueError, WireError) as exc:
            log.error("undecodable frame from client, dropping it: %s", exc)
            self._drop_client(client)
            return
        for message in messages:
            self._on_message(client, message)

    def _drop_client(self, client: Client) -> None:
        if client.sock.fileno() < 0:
            return  # dropped already
        client.broken = True  # nothing more is sent to it
        self.selector.unregister(client.sock)
        client.sock.close()
        if client.owner:
            self.stopping = True
            return
        self.queue = collections.deque(r for r in self.queue if r.client is not client)
        self.contexts.drop_client(client)
        for child in self.running.values():
            if child.request is not None and child.request.client is client:
                child.request.client = None
                _kill(child.pid, group=not self.state.pidns)

    def _on_message(self, client: Client, message: dict[str, Any]) -> None:
        now = time.monotonic()
        if message.get("t") == "withdraw" and isinstance(message.get("ids"), list):
            self._withdraw(client, message["ids"], running=bool(message.get("running")))
            return
        if message.get("t") == "cancel" and isinstance(message.get("ids"), list):
            self._cancel(client, message["ids"])
            return
        if message.get("t") in CONTEXT_MESSAGES:
            self._on_context_message(client, message)
            return
        request_id = message.get("id")
        if message.get("t") != "run" or not isinstance(request_id, int):
            log.error("ignoring malformed message of type %r", message.get("t"))
            return
        code = message.get("code")
        try:
            limits = codec.decode_limits(message.get("limits"))
        except WireError as exc:
            self._send(client, _rejected(request_id, str(exc)))
            return
        if not isinstance(code, bytes):
            self._send(client, _rejected(request_id, "code must be bytes on the wire"))
            return
        snippet = None
        try:
            if message.get("inputs") is not None:
                snippet = Snippet.from_record("", message["inputs"])
        except WireError as exc:
            self._send(client, _rejected(request_id, str(exc)))
            return
        if len(code) > limits.max_code_bytes:
            too_big = f"code is {len(code)} bytes, over the {limits.max_code_bytes} limit"
        else:
            too_big = snippet.check_sizes(limits) if snippet is not None else ""
        if too_big:
            self._send(client, _rejected(request_id, too_big))
            return
        plain = snippet is None or not snippet.has_inputs
        kind = routing.HEAVY if self.router is None else self.router.kind(code, plain=plain)
        self.queue.append(Request(client, request_id, code, limits, now, kind, snippet))

    def _on_context_message(self, client: Client, message: dict[str, Any]) -> None:
        """Orders on interpreter contexts (context_host.py), checked as runs are."""
        kind, request_id = message["t"], message.get("id")
        limits = None
        if kind in ("ctx_open", "ctx_call"):
            if not isinstance(request_id, int):
                log.error("ignoring a %s without an id", kind)
                return
            reply = _rejected(request_id, "")
            if kind == "ctx_open":
                reply = {"t": "ctx", "id": request_id, "ctxs": [], "error": ""}
            try:
                limits = codec.decode_limits(message.get("limits"))
            except WireError as exc:
                self._send(client, _refusal(reply, str(exc)))
                return
            if kind == "ctx_open" and self.config.mode != "fork":
                self._send(client, _refusal(reply, "contexts need fork mode"))
                return
            code = message.get("code", b"")
            if not isinstance(code, bytes) or len(code) > limits.max_code_bytes:
                self._send(client, _refusal(reply, "code must be bytes within max_code_bytes"))
                return
        self.contexts.on_message(client, message, limits)

    def _withdraw(self, client: Client, ids: list[Any], *, running: bool) -> None:
        """Drop the client's requests ``ids`` that wait in the queue; with ``running``,
        also kill those that run (their results go nowhere). Says which, in one reply."""
        wanted = set(ids)
        withdrawn = [r.id for r in self.queue if r.client is client and r.id in wanted]
        if withdrawn:
            self.queue = collections.deque(
                r for r in self.queue if not (r.client is client and r.id in wanted)
            )
        if running:
            for child in self.running.values():
                request = child.request
                if request is None or request.client is not client or request.id not in wanted:
                    continue
                if child.reported:
                    continue  # its result went out already
                request.client = None
                _kill(child.pid, group=not self.state.pidns)
                withdrawn.append(request.id)
        if withdrawn:
            self._send(client, {"t": "withdrawn", "ids": withdrawn})

    def _cancel(self, client: Client, ids: list[Any]) -> None:
        """The client gave up on requests ``ids``: those that wait are dropped, those
        that run killed, all before anything else starts (so none of them takes a slot
        another of them frees); each result is a cancellation, sent at once. A killed
        child's slot is free at once too: the next request starts while it dies (it runs
        nothing more), not after the wake-up that reaps it. Nothing to do for a request
        whose result went out."""
        wanted = set(ids)
        dropped = [r for r in self.queue if r.client is client and r.id in wanted]
        if dropped:
            self.queue = collections.deque(
                r for r in self.queue if not (r.client is client and r.id in wanted)
            )
        for request in dropped:
            self._send(client, _cancelled(request.id))
        for child in list(self.running.values()):
            asked = child.request
            if asked is None or asked.client is not client or asked.id not in wanted:
                continue
            if not child.reported:
                child.cancelled, child.deadline = True, None
                _kill(child.pid, group=not self.state.pidns)
                self.dying[child.pid] = self.running.pop(child.pid)
                self._report(child, -signal.SIGKILL, 0.0, 0, time.monotonic())

    # -- children ------------------------------------------------------------------

    def _request_clone(self, kind: str, *, family: context_host.Family | None = None) -> None:
        """Ask a zygote for one more waiting child (or a context family's first); it
        arrives in _on_zygote."""
        if family is None:
            slot = self.free_slots.popleft()
            uid = self.uid_base + slot if self.state.separate_uid else None
        else:
            slot = family.uid_index
            uid = self.context_uid_base + slot if self.state.separate_uid else None
        fallback_dir = None
        if not self.state.pidns:
            fallback_dir = leftovers.make_dir(FALLBACK_PREFIX)
            if uid is not None:
                os.chown(fallback_dir, uid, uid)
        parent_sock, child_sock = socket.socketpair()
        out_fd = os.memfd_create("stdout", os.MFD_CLOEXEC)
        err_fd = os.memfd_create("stderr", os.MFD_CLOEXEC)
        done_fd, done_end = done.open_pipe()
        header = CLONE_REQUEST.pack(-1 if uid is None else uid) + (fallback_dir or "").encode()
        fds = [child_sock.fileno(), out_fd, err_fd, done_end]
        socket.send_fds(self.zygotes[kind].sock, [header], fds)
        child_sock.close()
        os.close(done_end)
        child = Child(0, -1, parent_sock, out_fd, err_fd, slot, fallback_dir, kind, done_fd)
        child.uid, child.family = uid, family
        self.cloning[kind].append(child)

    def _on_zygote(self, kind: str) -> None:
        try:
            reply = self.zygotes[kind].sock.recv(4096)
        except OSError:
            reply = b""
        if not reply:
            log.error("the %s zygote exited; stopping so the executor restarts all", kind)
            self.stopping = True
            return
        (pid,) = CLONE_REPLY.unpack(reply)
        child = self.cloning[kind].popleft()
        child.pid = pid
        child.pidfd = os.pidfd_open(pid)
        self.selector.register(child.pidfd, selectors.EVENT_READ, ("child", child))
        if child.family is not None:
            family = child.family
            limits = family.limits
            # Its forks count against its process limit too, and so does the spare fork
            # each may hold (context_spare.py), so a call never has fewer than max_procs.
            procs = limits.max_procs + 2 * self.contexts.max_contexts + 1
            start = dataclasses.replace(limits, max_procs=procs)
            request = ChildRequest.encode(b"", start, context=True)
            self.contexts.on_cloned(family, child, request)
            return
        if self.state.pidns:  # where a notice can be acted on (worker/engine/done.py)
            self.selector.register(child.done_fd, selectors.EVENT_READ, ("done", child))
        self.warm_children[kind].append(child)

    def _dispatch(self) -> None:
        self._start_queued()
        self._keep_warm()

    def _start_queued(self) -> None:
        # In arrival order: a snippet whose zygote has no child waiting holds the ones
        # behind it only as long as one clone takes.
        while len(self.running) + self.contexts.busy < self.config.concurrency:
            since = self.contexts.queued_since()
            if since is not None and (not self.queue or since < self.queue[0].received):
                self.contexts.start_next()  # a context's call, older than any snippet
                continue
            if not self.queue:
                break
            request = self.queue[0]
            if request.client is None:
                self.queue.popleft()
                continue
            warm = self.warm_children[request.kind]
            if not warm:
                break
            self.queue.popleft()
            child = warm.popleft()
            child.request = request
            try:
                child.sock.sendall(
                    ChildRequest.encode(request.code, request.limits, request.snippet)
                )
            except OSError:
                pass  # it died while warm; its exit is reported as an infra result
            child.started = time.monotonic()
            child.deadline = child.started + request.limits.timeout_s
            self.running[child.pid] = child

    def _keep_warm(self) -> None:
        # Two children wait ready when idle or busy; while a lone snippet runs, one is
        # enough, and cloning the second waits until it ends, so neither the clone nor
        # the new child's setup competes with the snippet for the CPU.
        for kind, warm in self.warm_children.items():
            wanted = 1 if self.running and not self.queue else 2
            if not self.prefork:  # children die in setup here: clone only on demand
                needed = self.queue and self.queue[0].kind == kind
                wanted = 1 if needed and len(self.running) < self.config.concurrency else 0
            while len(warm) + len(self.cloning[kind]) < wanted and self.free_slots:
                self._request_clone(kind)

    def _on_child_exit(self, child: Child) -> None:
        if not self.state.pidns:
            # What it started dies with it: its process group, killed while the unreaped
            # child still holds the group's id (so the id cannot name anyone else's).
            _kill(-child.pid, group=False)
        _, status, rusage = os.wait4(child.pid, 0)
        ended = time.monotonic()
        self.selector.unregister(child.pidfd)
        os.close(child.pidfd)
        if child.family is not None:
            setup_error = readback.read_whole(child.err_fd).strip().rsplit("\n", 1)[-1]
            self.contexts.on_family_exit(child.family, setup_error)
            child.sock.close()
            os.close(child.out_fd)
            os.close(child.err_fd)
            self._clean_up_after(child)
            return
        self._forget_notice(child)
        self._take_ready(child)  # "ready" and its fds, unless the notice read them
        child.sock.close()
        self.dying.pop(child.pid, None)
        if self.running.pop(child.pid, None) is not None:
            # Its slot's next snippet starts before this one's result is read and sent,
            # so the CPU it frees is not left idle meanwhile.
            self._start_queued()
        if child in self.warm_children[child.kind]:
            self.warm_children[child.kind].remove(child)
            self.prefork = False
            log.error(
                "a waiting child died before use (status %d): %s",
                status,
                readback.read_whole(child.err_fd)[-500:],
            )
        elif not child.reported:
            # Killed at its notice, it ended with the notice's code.
            code = os.waitstatus_to_exitcode(status) if child.notice is None else child.notice.code
            self._report(child, code, rusage.ru_utime + rusage.ru_stime, rusage.ru_maxrss, ended)
        for fd in child.handed:
            os.close(fd)
        os.close(child.out_fd)
        os.close(child.err_fd)
        self._clean_up_after(child)
        self.free_slots.append(child.slot)

    def _on_notice(self, child: Child) -> None:
        """A running child said its snippet ended: it is killed, and unless processes of
        its own are left (they die with it, so its exit is waited for), its result goes
        out now, before its exit's teardown (worker/engine/done.py)."""
        notice = done.read_notice(child.done_fd)
        self._forget_notice(child)
        if notice is None or child.timed_out or self.running.get(child.pid) is not child:
            return
        if child.cancelled:
            return
        _kill(child.pid, group=False)  # nothing more of it runs, forged notice or not
        child.notice, child.deadline = notice, None
        if done.alone(child.pid, notice) and self._take_ready(child):
            ended = time.monotonic()
            self._report(child, notice.code, notice.cpu_s, notice.max_rss_kb, ended)

    def _forget_notice(self, child: Child) -> None:
        if child.done_fd < 0:
            return
        if self.state.pidns and child.pidfd >= 0:
            self.selector.unregister(child.done_fd)
        os.close(child.done_fd)
        child.done_fd = -1

    def _take_ready(self, child: Child) -> bool:
        """Whether the child said "ready"; the fds it sent with it (inputs.say_ready)
        are kept in ``child.handed`` until its exit."""
        if child.ready is None:
            try:
                message, child.handed, _, _ = socket.recv_fds(child.sock, 1, 2, socket.MSG_DONTWAIT)
                child.ready = message == READY
            except OSError:
                child.ready = False
        return child.ready

    def _report(self, child: Child, code: int, cpu_s: float, max_rss_kb: int, ended: float) -> None:
        child.reported = True
        if child.request is None or child.request.client is None:
            return
        if child.cancelled:
            self._send(child.request.client, _cancelled(child.request.id))
            return
        ready = bool(child.ready)
        self.prefork = self.prefork or ready
        result = _result(child, code, cpu_s, max_rss_kb, ended, ready)
        if ready:
            result.update(_read_back(child, child.handed))
        if self.config.mode == "fork":
            result["zygote"] = child.kind
        self._send(child.request.client, {"t": "result", "id": child.request.id, "r": result})

    def _clean_up_after(self, child: Child) -> None:
        if child.fallback_dir is not None:
            shutil.rmtree(child.fallback_dir, ignore_errors=True)
        if not self.state.pidns and child.uid is not None:
            leftovers.sweep_uid(child.uid)  # /dev/shm included
        elif self.shm_sweep is not None and child.request is not None:
            self.shm_sweep.after_snippet(self.running.keys())

    def _expire_deadlines(self) -> float | None:
        now = time.monotonic()
        soonest: float | None = None
        for child in self.running.values():
            if child.deadline is None:
                continue
            if child.deadline <= now:
                child.timed_out = True
                child.deadline = None
                _kill(child.pid, group=not self.state.pidns)
            elif soonest is None or child.deadline < soonest:
                soonest = child.deadline
        return None if soonest is None else max(0.0, soonest - now)

    # -- loop ----------------------------------------------------------------------

    def serve(self) -> None:
        try:
            while not self.stopping:
                while self._broken:
                    self._drop_client(self._broken.pop())
                if self.stopping:
                    break
                self._dispatch()
                timeout = self._expire_deadlines()
                until = self.contexts.expire(time.monotonic())
                if until is not None and (timeout is None or until < timeout):
                    timeout = until
                for key, mask in self.selector.select(timeout):
                    kind, obj = key.data
                    if kind == "client":
                        if mask & selectors.EVENT_WRITE and not obj.broken:
                            self._sent(obj, obj.flush())
                        if mask & selectors.EVENT_READ and not obj.broken:
                            self._on_client(obj)
                    elif kind == "listener":
                        self._accept()
                    elif kind == "zygote":
                        self._on_zygote(obj)
                    elif kind == "done":
                        self._on_notice(obj)
                    elif kind == "context":
                        self._on_context_readable(obj)
                    elif kind == "reaped":
                        self.contexts.on_reaped(obj)
                    else:
                        self._on_child_exit(obj)
        finally:
            self.shutdown()

    def _on_context_readable(self, ctx: context_host.Ctx) -> None:
        self.contexts.on_readable(ctx)

    def shutdown(self) -> None:
        ends = time.monotonic() + EXIT_FLUSH_S  # what clients have not read: one try
        for key in list(self.selector.get_map().values()):
            if key.data[0] == "client":
                key.data[1].flush_before_exit(ends - time.monotonic())
        children = [*self.running.values(), *self.dying.values(), *self.contexts.shutdown()]
        children += [child for warm in self.warm_children.values() for child in warm]
        for child in children:
            _kill(child.pid, group=not self.state.pidns)
        for child in children:
            try:
                os.waitpid(child.pid, 0)
            except ChildProcessError:
                pass
            self._clean_up_after(child)
        if self.shm_sweep is not None:
            self.shm_sweep.after_snippet(())  # every snippet has ended
        cloning = [child for queued in self.cloning.values() for child in queued]
        for child in cloning:  # asked for, never arrived: only its dir exists
            if child.fallback_dir is not None:
                shutil.rmtree(child.fallback_dir, ignore_errors=True)


def _kill(pid: int, *, group: bool) -> None:
    # With a PID namespace, killing its init takes every process of the snippet with it;
    # without one, the child leads its own session and we kill that process group.
    for target in (pid, -pid) if group else (pid,):
        try:
            os.kill(target, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _result(
    child: Child, returncode: int, cpu_s: float, max_rss_kb: int, ended: float, ready: bool
) -> dict[str, Any]:
    assert child.request is not None
    limits = child.request.limits
    exec_s = ended - child.started
    queue_s = child.started - child.request.received
    if not ready and not child.timed_out:
        detail = readback.read_whole(child.err_fd).strip().rsplit("\n", 1)[-1]
        failed = infra(f"codepool: sandbox setup failed: {detail}", latency=queue_s + exec_s)
        return failed.replace(exec_s=exec_s, queue_s=queue_s).to_dict()
    return outcome.finished_record(
        out_fd=child.out_fd,
        err_fd=child.err_fd,
        limits=limits,
        returncode=returncode,
        timed_out=child.timed_out,
        cpu_s=cpu_s,
        max_rss_kb=max_rss_kb,
        queue_s=queue_s,
        exec_s=exec_s,
    )


def _read_back(child: Child, handed: list[int]) -> dict[str, Any]:
    """The fetched files and notebook cells of a child that got as far as "ready"."""
    request = child.request
    assert request is not None
    snippet = request.snippet
    if snippet is None:
        return {}
    fds = list(handed)
    back: dict[str, Any] = {}
    if snippet.fetch_files and fds:
        back["files"] = readback.fetch(
            fds.pop(0), snippet.fetch_files, request.limits.max_fetch_bytes
        )
    if snippet.cells is not None and fds:
        back["cells"] = readback.notebook_cells(
            fds.pop(0), child.out_fd, child.err_fd, request.limits.max_output_chars
        )
    return back


def _rejected(request_id: int, message: str) -> dict[str, Any]:
    return {"t": "result", "id": request_id, "r": rejected(f"rejected: {message}").to_dict()}


def _refusal(reply: dict[str, Any], message: str) -> dict[str, Any]:
    """``reply`` (a result or a ctx answer) refusing its order for ``message``."""
    if reply["t"] == "result":
        return _rejected(reply["id"], message)
    return {**reply, "error": message}


CONTEXT_MESSAGES = ("ctx_open", "ctx_call", "ctx_fork", "ctx_close")


def _cancelled(request_id: int) -> dict[str, Any]:
    record = cancelled("codepool: cancelled: its caller gave up on it").to_dict()
    return {"t": "result", "id": request_id, "r": record}


@dataclass
class ZygoteHandle:
    """The supervisor's view of its zygote."""

    process: subprocess.Popen[bytes]
    sock: socket.socket
    pid: int
    state: isolation.IsolationState
    report: list[dict[str, object]]
    native: bool  # its children are set up in C


# ``python -B -c``, as the reference runs snippets, so its children's sys.flags are the
# reference's; the cwd is not searched for codepool's modules.
ZYGOTE_BOOT = (
    "import sys; del sys.path[0]; from codepool.worker.engine import zygote; zygote.main()"
)


def launch_zygote(config: ZygoteConfig) -> tuple[subprocess.Popen[bytes], socket.socket]:
    """Start a zygote; its hello is awaited by ``await_zygote`` (so two start at once)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    zygote_config = dataclasses.replace(config, owner_fd=theirs.fileno(), listen_fd=-1)
    process = subprocess.Popen(
        [sys.executable, "-B", "-c", ZYGOTE_BOOT],
        pass_fds=[theirs.fileno()],
        stdin=subprocess.PIPE,
    )
    send_config(process, zygote_config)
    theirs.close()
    return process, ours


def await_zygote(
    launched: tuple[subprocess.Popen[bytes], socket.socket], timeout_s: float = 300.0
) -> ZygoteHandle:
    process, ours = launched
    ours.settimeout(timeout_s)
    try:
        hello = codec.loads(ours.recv(1 << 20))
    except (OSError, WireError) as exc:
        process.kill()
        raise SystemExit(f"codepool: the zygote did not start: {exc}") from exc
    ours.settimeout(None)
    state = isolation.IsolationState(
        root=hello["root"], pidns=hello["pidns"], separate_uid=hello["separate_uid"]
    )
    return ZygoteHandle(process, ours, hello["pid"], state, hello["report"], hello["native"])


def start_zygotes(config: ZygoteConfig) -> dict[str, ZygoteHandle]:
    """The heavy zygote (it preloads), and in fork mode with a preload a light one for
    snippets that import none of it and, with more than one module preloaded, a mid one
    for snippets that import only the first (see routing)."""
    launched = {routing.HEAVY: launch_zygote(config)}
    if config.mode == "fork" and config.light_zygote:
        if config.native_child and native.unavailable_here() is None:
            bare_config = dataclasses.replace(config, preload=[], bare=True)
            launched[routing.BARE] = launch_zygote(bare_config)
        if config.preload:
            launched[routing.LIGHT] = launch_zygote(dataclasses.replace(config, preload=[]))
        mid = routing.mid_preload(config.preload)
        if mid is not None:
            launched[routing.MID] = launch_zygote(dataclasses.replace(config, preload=mid))
    zygotes = {kind: await_zygote(started) for kind, started in launched.items()}
    if routing.BARE in zygotes and not zygotes[routing.BARE].native:
        # It could not exec the bare image (the C set-up needs what this host lacks, as
        # the report's "child set-up" line says): the light or heavy one does as well.
        unused = zygotes.pop(routing.BARE)
        unused.sock.close()
        wait_or_kill(unused.process, 5.0)
    if len(zygotes) > 1:
        parts = []
        if routing.BARE in zygotes:
            parts.append("a bare one (the interpreter and the C set-up) for plain snippets")
        if routing.LIGHT in zygotes:
            parts.append("a light one (no preload) for the rest whose imports are all stdlib")
        if routing.MID in zygotes:
            parts.append(f"a mid one ({config.preload[0]} alone) for those that import only it")
        parts.append("the heavy one for the rest")
        zygotes[routing.HEAVY].report.append(
            # A speed-up, not a protection: never a failing line.
            {"name": "zygotes", "active": True, "detail": ", ".join(parts)}
        )
    return zygotes


def main(argv: list[str]) -> None:
    config, owner = enter("supervisor")
    zygotes = start_zygotes(config)
    if not zygotes[routing.HEAVY].state.pidns:
        leftovers.sweep(FALLBACK_PREFIX, b"codepool.worker.engine.supervisor")
    try:
        Supervisor(config, zygotes, owner).serve()
    finally:
        for zygote in zygotes.values():
            zygote.sock.close()
        for zygote in zygotes.values():
            wait_or_kill(zygote.process)


if __name__ == "__main__":
    main(sys.argv)
