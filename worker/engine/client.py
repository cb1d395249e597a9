"""SupervisorClient: submit snippets to a zygote over its socket (thread-safe).

Both the executor that owns a zygote (LocalExecutor) and the RQ dispatchers that share
one on the same host (AttachedExecutor) are clients. Any number of threads may call
``submit``/``run``/``run_many`` at once. If the connection is lost, the client gets a new
one (the owner restarts the supervisor; an attached client reconnects) and re-sends what was
in flight once; a snippet lost twice comes back with ``status="infra"``. ``cancel``
gives up on a snippet: the supervisor drops it if it waits and kills it if it runs.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from codepool.common.errors import ContextError, ExecutorError, WireError
from codepool.common.limits import Limits
from codepool.common.result import ExecResult, cancelled, infra, rejected
from codepool.common.retry import retry_until
from codepool.common.snippet import Snippet, split_inputs
from codepool.worker.engine.context import RESTARTED, Context
from codepool.worker.engine.protocol import FrameReader, encode_frame, recv_one

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 2


@dataclass
class _Pending:
    future: Future[ExecResult]
    code: bytes
    limits: Limits
    submitted: float
    inputs: dict[str, Any] | None = None  # Snippet.inputs_record()
    attempts: int = 0
    generation: int = -1  # which connection it was last sent on
    withdrawn: bool = False  # asked back: not sent again after a reconnect
    cancelled: bool = False  # given up on: never sent again
    context: int | None = None  # a call on this interpreter context
    before: Callable[[ExecResult], None] | None = None  # run with the result, before the future


class SupervisorClient:
    """The client side of the supervisor's protocol; subclasses say how to connect."""

    def __init__(
        self, *, limits: Limits | None, max_limits: Limits | None, name: str | None
    ) -> None:
        self.limits = limits or Limits()
        self.max_limits = max_limits or self.limits
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._closing = False
        self._sock: socket.socket | None = None
        self._reader: threading.Thread | None = None
        self._generation = 0
        self._reconnecting = False
        self.report: list[dict[str, Any]] = []
        self.supervisor_pid = 0  # serves requests; every snippet is its child
        self.zygote_pids: list[int] = []  # the zygotes that clone them (routing.KINDS)
        self.concurrency = 0
        self.snippet_uids: range = range(0)  # uids snippets run as (empty: worker's own)
        self.restarts = 0
        self._orders: dict[int, tuple[Future[Any], Callable[[dict[str, Any]], Any]]] = {}
        self._contexts: weakref.WeakValueDictionary[int, Context] = weakref.WeakValueDictionary()

    @property
    def zygote_pid(self) -> int:
        """The heavy zygote (the one that preloaded), 0 before the first hello."""
        return self.zygote_pids[0] if self.zygote_pids else 0

    # -- subclass hooks --------------------------------------------------------------

    def _open(self) -> socket.socket:
        """A connected socket to a zygote whose hello has not been read yet."""
        raise NotImplementedError

    def _lost(self) -> None:
        """Called (reader thread) after the connection was lost, before reconnecting."""

    def _shutdown(self) -> None:
        """Called by close() after the socket is shut down."""

    # -- public API ------------------------------------------------------------------

    def submit(self, code: Any, **keywords: Any) -> Future[ExecResult]:
        """Queue one snippet (a str, or a Snippet with stdin, files, fetch_files or
        notebook cells); the future resolves to its ExecResult. Keywords: Limits fields,
        and the inputs of a str snippet (``stdin=``, ``files=``, ``fetch_files=``,
        ``cells=``, ``cell_timeout_s=``). Never raises for bad code (that is a
        ``rejected`` result); raises ConfigError for bad keywords."""
        code, limits = split_inputs(code, keywords)
        return self.submit_limited(code, self.limits.with_overrides(**limits))

    def submit_limited(self, code: Any, limits: Limits) -> Future[ExecResult]:
        """Like submit, with complete Limits (clamped to ``max_limits``)."""
        effective = limits.clamp(self.max_limits)
        future: Future[ExecResult] = Future()
        # A plain str (most snippets) goes as it is; a Snippet brings its inputs.
        if isinstance(code, str):
            source, inputs, too_big = code, None, ""
        elif isinstance(code, Snippet):
            source, inputs, too_big = code.source, code.inputs_record(), code.check_sizes(effective)
        else:
            future.set_result(
                rejected(f"rejected: code must be str, got {type(code).__name__}", worker=self.name)
            )
            return future
        # surrogatepass keeps lone surrogates; the child's compile() reports them as
        # Python reports undecodable source.
        data = source.encode("utf-8", "surrogatepass")
        if len(data) > effective.max_code_bytes:
            too_big = f"code is {len(data)} bytes, over the {effective.max_code_bytes} byte limit"
        if too_big:
            future.set_result(rejected(f"rejected: {too_big}", worker=self.name))
            return future
        pending = _Pending(future, data, effective, time.monotonic(), inputs)
        with self._lock:
            if self._closing:
                raise ExecutorError("executor is closed")
            request_id = next(self._ids)
            self._pending[request_id] = pending
            sock, generation, reconnecting = self._sock, self._generation, self._reconnecting
        if sock is not None:
            self._send(sock, generation, request_id, pending)
        elif not reconnecting:
            self._finish(
                request_id, infra("codepool: the executor's zygote is down", worker=self.name)
            )
        # else: the reconnect re-sends everything still pending
        return future

    def cancel(self, future: Future[ExecResult]) -> bool:
        """Give up on the snippet ``future`` is for: the supervisor drops it if it waits
        for a slot and kills it if it runs, and the future resolves with status
        ``cancelled`` (or with its result, if that came first). False if it is not
        pending here (resolved already)."""
        return self.cancel_many([future]) == 1

    def cancel_many(self, futures: Iterable[Future[ExecResult]]) -> int:
        """``cancel`` for many snippets at once, in one message: none of them starts in
        a slot another of them frees. Returns how many were pending here."""
        wanted = set(futures)
        with self._lock:
            found = [(i, p) for i, p in self._pending.items() if p.future in wanted]
            sock, generation = self._sock, self._generation
            ids, unsent = [], []
            for request_id, pending in found:
                if pending.cancelled:
                    continue  # asked already
                pending.cancelled = True
                if sock is not None and pending.generation == generation:
                    ids.append(request_id)
                else:  # not on this connection: it is never sent again
                    unsent.append(request_id)
        for request_id in unsent:
            message = "codepool: cancelled: its caller gave up on it"
            self._finish(request_id, cancelled(message, worker=self.name))
        if ids and sock is not None:
            frame = encode_frame({"t": "cancel", "ids": ids})
            try:
                with self._send_lock:
                    sock.sendall(frame)
            except OSError:
                pass  # the reader sees the supervisor die; a cancelled request is not re-sent
        return len(found)

    # -- interpreter contexts ----------------------------------------------------------

    def context(self, **limits: Any) -> Context:
        """Open an interpreter context (worker/engine/context.py): state kept between
        its calls, forkable. Keywords: Limits fields, its defaults (memory_mb, max_procs
        and max_file_mb hold for its whole life). Raises ContextError when the host
        holds its cap of live contexts."""
        return self.open_context(**limits).result()

    async def acontext(self, **limits: Any) -> Context:
        return await asyncio.wrap_future(self.open_context(**limits))

    def open_context(self, **limits: Any) -> Future[Context]:
        effective = self.limits.with_overrides(**limits).clamp(self.max_limits)

        def made(reply: dict[str, Any]) -> Context:
            if reply.get("error") or not reply.get("ctxs"):
                raise ContextError(f"cannot open a context: {reply.get('error')}")
            record = reply["ctxs"][0]
            context = Context(self, record["id"], effective, pid=record["pid"])
            self._contexts[context.id] = context
            return context

        return self._order({"t": "ctx_open", "limits": effective.to_dict()}, made)

    def _context_fork(self, parent: Context, n: int, history: list[str]) -> Future[list[Context]]:
        def made(reply: dict[str, Any]) -> list[Context]:
            forks = [
                Context(self, record["id"], parent.limits, pid=record["pid"], history=history)
                for record in reply.get("ctxs", [])
            ]
            for fork in forks:
                self._contexts[fork.id] = fork
            if reply.get("error"):
                for fork in forks:
                    fork.close()
                raise ContextError(f"cannot fork the context: {reply['error']}")
            return forks

        return self._order({"t": "ctx_fork", "ctx": parent.id, "n": n}, made)

    def _context_call(
        self, context_id: int, code: str, limits: Limits, before: Callable[[ExecResult], None]
    ) -> Future[ExecResult]:
        effective = limits.clamp(self.max_limits)
        future: Future[ExecResult] = Future()
        data = code.encode("utf-8", "surrogatepass")
        if len(data) > effective.max_code_bytes:
            too_big = f"code is {len(data)} bytes, over the {effective.max_code_bytes} byte limit"
            future.set_result(rejected(f"rejected: {too_big}", worker=self.name))
            return future
        pending = _Pending(future, data, effective, time.monotonic(), context=context_id)
        pending.before = before
        with self._lock:
            if self._closing:
                raise ExecutorError("executor is closed")
            request_id = next(self._ids)
            self._pending[request_id] = pending
            sock, generation = self._sock, self._generation
        if sock is not None:
            self._send(sock, generation, request_id, pending)
        else:
            message = f"codepool: {RESTARTED}"
            self._finish(request_id, infra(message, worker=self.name))
        return future

    def _context_close(self, context_id: int) -> None:
        self._send_frame({"t": "ctx_close", "ctx": context_id})

    def _order(self, message: dict[str, Any], made: Callable[[dict[str, Any]], Any]) -> Future[Any]:
        """Send a context order; the future resolves to ``made(reply)``."""
        future: Future[Any] = Future()
        with self._lock:
            if self._closing:
                raise ExecutorError("executor is closed")
            request_id = next(self._ids)
            self._orders[request_id] = (future, made)
        if not self._send_frame({**message, "id": request_id}):
            self._answer(request_id, {"error": "the executor's supervisor is down"})
        return future

    def _answer(self, request_id: int, reply: dict[str, Any]) -> None:
        with self._lock:
            order = self._orders.pop(request_id, None)
        if order is None:
            return
        future, made = order
        try:
            future.set_result(made(reply))
        except ContextError as exc:
            future.set_exception(exc)

    def _send_frame(self, message: dict[str, Any]) -> bool:
        with self._lock:
            sock = self._sock
        if sock is None:
            return False
        try:
            with self._send_lock:
                sock.sendall(encode_frame(message))
        except OSError:
            return False
        return True

    def _contexts_lost(self, reason: str) -> None:
        """The supervisor went: every context's state with it."""
        for context in list(self._contexts.values()):
            context._end(reason)
        with self._lock:
            ids = list(self._orders)
        for request_id in ids:
            self._answer(request_id, {"error": reason})

    def run(self, code: Any, **keywords: Any) -> ExecResult:
        """Run one snippet and wait for its result. Keywords: as ``submit``'s."""
        return self.submit(code, **keywords).result()

    def run_many(self, codes: Iterable[Any], **limits: Any) -> list[ExecResult]:
        """Run snippets (str or Snippet) concurrently (up to ``concurrency``); results
        in input order."""
        futures = [self.submit(code, **limits) for code in codes]
        return [f.result() for f in futures]

    def withdraw(self, futures: Iterable[Future[ExecResult]], *, running: bool = False) -> None:
        """Take snippets back: those of ``futures`` that have not started are dropped
        (their futures are cancelled, soon after this returns), and with ``running``
        those that run are killed and dropped too. The rest resolve as usual, as do
        futures already done. For a host that stops: what it drops runs elsewhere."""
        wanted = set(futures)
        with self._lock:
            ids = []
            for request_id, pending in self._pending.items():
                if pending.future in wanted:
                    pending.withdrawn = True
                    ids.append(request_id)
            sock = self._sock
        if not ids or sock is None:
            return  # a reconnect cancels them rather than sending them again
        frame = encode_frame({"t": "withdraw", "ids": ids, "running": running})
        try:
            with self._send_lock:
                sock.sendall(frame)
        except OSError:
            pass  # the reader sees the connection go, and the reconnect cancels them

    def close(self) -> None:
        """Disconnect; pending calls come back as infra."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            sock, reader = self._sock, self._reader
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._shutdown()
        if reader is not None and reader is not threading.current_thread():
            reader.join(timeout=10)
        if sock is not None:
            sock.close()
        self._fail_all("codepool: executor closed before this snippet finished")
        self._contexts_lost("the executor was closed")

    # -- connection ------------------------------------------------------------------

    def _connect(self) -> None:
        """Open a connection, read the hello, start its reader, re-send what is pending."""
        sock = self._open()
        try:
            hello = recv_one(sock, FrameReader())
        except (OSError, ValueError) as exc:
            sock.close()
            raise ExecutorError(f"no hello from the supervisor: {exc}") from exc
        if hello is None or hello.get("t") != "hello":
            sock.close()
            raise ExecutorError("the supervisor closed the connection before saying hello")
        sock.settimeout(None)
        self.report = list(hello["report"])
        self.supervisor_pid = int(hello["pid"])
        self.zygote_pids = [int(pid) for pid in hello["zygote_pids"]]
        self.concurrency = int(hello["concurrency"])
        uids = hello.get("uids")
        self.snippet_uids = range(uids[0], uids[1]) if uids else range(0)
        reader = threading.Thread(
            target=self._read_results, args=(sock,), name="codepool-executor-reader", daemon=True
        )
        with self._lock:
            self._sock, self._reader = sock, reader
            self._generation += 1
            generation = self._generation
            # Taken with the swap, so a concurrent submit is never sent twice.
            unsent = [(i, p) for i, p in self._pending.items() if p.generation < generation]
            self._reconnecting = False
        reader.start()
        for request_id, pending in unsent:
            if pending.context is not None:
                message = f"codepool: {RESTARTED}"
                self._finish(request_id, infra(message, worker=self.name))
            elif pending.withdrawn:
                self._cancel(request_id)
            elif pending.cancelled:
                message = "codepool: cancelled: its caller gave up on it"
                self._finish(request_id, cancelled(message, worker=self.name))
            elif pending.attempts >= MAX_ATTEMPTS:
                message = "codepool: the executor failed twice while running this snippet"
                self._finish(request_id, infra(message, worker=self.name))
            else:
                self._send(sock, generation, request_id, pending)

    def _read_results(self, sock: socket.socket) -> None:
        reader = FrameReader()
        while True:
            try:
                data = sock.recv(1 << 20)
                messages = reader.feed(data) if data else None
            except (OSError, ValueError) as exc:
                log.error("lost the supervisor connection: %s", exc)
                messages = None
            if messages is None:
                break
            for message in messages:
                if message.get("t") == "result":
                    self._on_result(message["id"], message["r"])
                elif message.get("t") == "withdrawn":
                    for request_id in message["ids"]:
                        self._cancel(request_id)
                elif message.get("t") == "ctx":
                    self._answer(message["id"], message)
                elif message.get("t") == "ctx_ended":
                    context = self._contexts.get(message["ctx"])
                    if context is not None:
                        context._end(str(message["reason"]))
        self._contexts_lost(RESTARTED)
        self._lost()
        with self._lock:
            if self._closing:
                return
            self._sock = None
            self._reconnecting = True
        self.restarts += 1
        try:
            self._connect()
        except ExecutorError as exc:
            with self._lock:
                self._reconnecting = False
            self._fail_all(f"codepool: could not get the supervisor back: {exc}")

    def _send(
        self, sock: socket.socket, generation: int, request_id: int, pending: _Pending
    ) -> None:
        pending.attempts += 1
        pending.generation = generation
        message = {"t": "run", "id": request_id, "code": pending.code}
        if pending.context is not None:
            message.update(t="ctx_call", ctx=pending.context)
        message["limits"] = pending.limits.to_dict()
        if pending.inputs is not None:
            message["inputs"] = pending.inputs
        try:
            frame = encode_frame(message)
        except WireError as exc:  # never out of submit, nor the reader thread's resend
            self._finish(request_id, rejected(f"rejected: {exc}", worker=self.name))
            return
        try:
            with self._send_lock:
                sock.sendall(frame)
        except OSError:
            pass  # the reader sees the supervisor die and re-sends or fails this request

    def _on_result(self, request_id: int, record: dict[str, Any]) -> None:
        with self._lock:
            pending = self._pending.get(request_id)
        if pending is None:
            return
        record = dict(record, latency=time.monotonic() - pending.submitted, worker=self.name)
        self._finish(request_id, ExecResult.from_dict(record))

    def _finish(self, request_id: int, result: ExecResult) -> None:
        with self._lock:
            pending = self._pending.pop(request_id, None)
        if pending is not None and not pending.future.done():
            if pending.before is not None:
                pending.before(result)
            pending.future.set_result(result)

    def _cancel(self, request_id: int) -> None:
        with self._lock:
            pending = self._pending.pop(request_id, None)
        if pending is not None:
            pending.future.cancel()

    def _fail_all(self, message: str) -> None:
        with self._lock:
            ids = list(self._pending)
        for request_id in ids:
            self._finish(request_id, infra(message, worker=self.name))

    def __enter__(self) -> SupervisorClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AttachedExecutor(SupervisorClient):
    """A client of a zygote another process owns (``codepool worker``'s dispatchers).

    path: the supervisor's Unix socket. reconnect_timeout_s: how long to keep trying when
    the supervisor is being restarted by its owner.
    """

    def __init__(
        self,
        path: str,
        *,
        limits: Limits | None = None,
        max_limits: Limits | None = None,
        name: str | None = None,
        reconnect_timeout_s: float = 120.0,
    ) -> None:
        super().__init__(limits=limits, max_limits=max_limits, name=name)
        self.path = path
        self.reconnect_timeout_s = reconnect_timeout_s
        self._connect()

    def _open(self) -> socket.socket:
        def attempt() -> socket.socket:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(self.path)
            except OSError:
                sock.close()
                raise
            sock.settimeout(self.reconnect_timeout_s)
            return sock

        deadline = time.monotonic() + self.reconnect_timeout_s
        try:
            return retry_until(deadline, attempt, errors=(OSError,), pause_s=0.1)
        except OSError as exc:
            raise ExecutorError(f"cannot connect to the supervisor at {self.path}: {exc}") from exc
