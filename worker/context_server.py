"""The worker host's context server: it answers the requests for the interpreter
contexts the host holds (common/context_requests.py), on the host's executor.

One thread waits on the host's request list (one blocking pop at a time, so an idle
host costs Redis one command every BLOCK_S) and hands each request to the executor
without waiting for it: calls and forks resolve on the executor's own threads, and
their replies go out from one writer thread. Calls on one context run one at a time,
in order (the engine's rule), calls on different contexts in parallel, each holding
one of the executor's slots only while it runs. A context the engine ended (a limit, its
idle TTL) is dropped here at its next request, which is told so. A context this host
does not hold though nothing ended it (the host restarted under its name, its
supervisor died and took the state with it) is answered *lost*: its caller rebuilds it
from its recorded calls, as for a host that is gone. A reply whose write fails is
written again until it gets through (within its TTL): a reply given up on made its
caller judge the host lost and run the call twice.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter, OrderedDict
from concurrent.futures import Future
from typing import Any, cast

import redis

from codepool.common.codec import encode_result
from codepool.common.connection import redis_client
from codepool.common.context_requests import ContextReply, ContextRequest
from codepool.common.errors import CodepoolError, WireError
from codepool.common.settings import Settings
from codepool.worker.engine.context import RESTARTED, Context
from codepool.worker.engine.executor import LocalExecutor

log = logging.getLogger(__name__)

BLOCK_S = 30
# Ended contexts whose reason a late request is still told (past that, it is "lost").
ENDED_REMEMBERED = 4096
REPLY_RETRY_S = 0.5
# Request ids remembered, so a request a producer sent again (its push's reply lost to
# a Redis restart) is not run twice.
SEEN_IDS = 4096
REPLY_TTL_S = 60
_STOP = object()


class ContextServer:
    """Serves host ``host``'s contexts on ``executor``."""

    def __init__(
        self, settings: Settings, executor: LocalExecutor, *, host: str, ttl_s: float
    ) -> None:
        self.ttl_s = ttl_s  # the executor's idle TTL, told to whoever opens a context
        # Its host's watcher follows a Sentinel's primary for it (worker/host.py).
        self.conn = redis_client(settings, block_s=BLOCK_S, watch_s=None)
        self.clients = (self.conn,)
        self.keys = settings.keys
        self.executor = executor
        self.host = host
        self.contexts: dict[str, Context] = {}
        self._lock = threading.Lock()
        self._replies: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._counts: Counter[str] = Counter()  # counters to add with the next reply
        self._ended: OrderedDict[str, str] = OrderedDict()  # dropped ones: why they ended
        self._seen: OrderedDict[str, None] = OrderedDict()  # request ids taken (reader's)
        self._stop = threading.Event()
        self._reader = threading.Thread(target=self._read, name="codepool-contexts", daemon=True)
        self._writer = threading.Thread(target=self._write, name="codepool-replies", daemon=True)

    def start(self) -> None:
        self._reader.start()
        self._writer.start()

    def stop(self) -> None:
        """Stop taking requests and end every context (their state goes with the host)."""
        self._stop.set()
        with self._lock:
            contexts, self.contexts = list(self.contexts.values()), {}
        for context in contexts:
            try:
                context.close()
            except CodepoolError:
                pass
        self._replies.put(_STOP)
        self._writer.join(timeout=5)
        self.conn.close()

    def live(self) -> int:
        with self._lock:
            return sum(context.ended is None for context in self.contexts.values())

    # -- requests --------------------------------------------------------------------

    def _read(self) -> None:
        key = self.keys.host_requests(self.host)
        while not self._stop.is_set():
            try:
                popped = self.conn.blpop([key], timeout=BLOCK_S)
            except (redis.RedisError, OSError, ValueError) as exc:
                if self._stop.is_set():
                    return
                log.warning("worker %s: context requests: %s", self.host, exc)
                self._stop.wait(1.0)
                continue
            self._sweep()
            if popped is None:
                continue
            try:
                request = ContextRequest.decode(cast(list[bytes], popped)[1])
            except WireError as exc:
                log.error("worker %s: dropped a context request: %s", self.host, exc)
                continue
            if request.id in self._seen:
                log.warning("worker %s: context request %s came twice", self.host, request.id)
                continue
            self._seen[request.id] = None
            if len(self._seen) > SEEN_IDS:
                self._seen.popitem(last=False)
            try:
                self._take(request)
            except Exception as exc:  # a bad request must not stop the server
                self._reply(request, ContextReply(ok=False, error=f"{type(exc).__name__}: {exc}"))

    def _take(self, request: ContextRequest) -> None:
        if request.op == "open":
            self._open(request)
            return
        with self._lock:
            context = self.contexts.get(request.ctx)
            if context is not None and context.ended is not None and request.op != "run":
                self._drop(request.ctx)
            reason = self._ended.get(request.ctx)
        if request.op == "close":
            if context is not None:
                with self._lock:
                    if self.contexts.pop(request.ctx, None) is not None:
                        self._ended[request.ctx] = "closed by its caller"
                context.close()
            self._reply(request, ContextReply(ok=True))
            return
        if context is None or context.ended == RESTARTED:
            if reason is not None and reason != RESTARTED:
                message = f"no such context on this host: it ended ({reason})"
                self._reply(request, ContextReply(ok=False, error=message))
                return
            why = RESTARTED if reason or context else "this host does not hold it (it restarted)"
            self._reply(request, ContextReply(ok=False, error=why, lost=True))
            return
        if request.op == "run":
            future = context.submit(request.code, **request.limits)
            future.add_done_callback(lambda f: self._ran(request, context, f))
        else:  # fork
            forked = context.submit_fork(len(request.new))
            forked.add_done_callback(lambda f: self._forked(request, f))

    def _open(self, request: ContextRequest) -> None:
        opened = self.executor.open_context(**request.limits)

        def done(future: Future[Context]) -> None:
            try:
                context = future.result()
            except CodepoolError as exc:
                self._reply(request, ContextReply(ok=False, error=str(exc)))
                return
            with self._lock:
                self.contexts[request.ctx] = context
                self._counts["contexts_opened"] += 1
            self._reply(request, ContextReply(ok=True, ttl_s=self.ttl_s))

        opened.add_done_callback(done)

    def _ran(self, request: ContextRequest, context: Context, future: Future[Any]) -> None:
        try:
            result = future.result()
        except CodepoolError as exc:
            self._reply(request, ContextReply(ok=False, error=str(exc)))
            return
        if context.ended == RESTARTED and result.status in ("infra", "rejected"):
            # The supervisor went during the call (or before it): not the call's doing.
            with self._lock:
                if self.contexts.get(request.ctx) is context:
                    self._drop(request.ctx)
            self._reply(request, ContextReply(ok=False, error=RESTARTED, lost=True))
            return
        with self._lock:
            self._counts["context_calls"] += 1
            if context.ended is not None and self.contexts.get(request.ctx) is context:
                self._drop(request.ctx)
                by_limit = result.status != "rejected"  # else it had ended before
                self._counts["contexts_ended_limit" if by_limit else "contexts_ended_ttl"] += 1
        self._reply(request, ContextReply(ok=True, result=encode_result(result)))

    def _forked(self, request: ContextRequest, future: Future[list[Context]]) -> None:
        try:
            forks = future.result()
        except CodepoolError as exc:
            self._reply(request, ContextReply(ok=False, error=str(exc)))
            return
        with self._lock:
            self.contexts.update(zip(request.new, forks, strict=True))
            self._counts["contexts_forked"] += len(forks)
        self._reply(request, ContextReply(ok=True))

    def _sweep(self) -> None:
        """Drop the contexts the engine ended on its own (their idle TTL), counted."""
        with self._lock:
            ended = [key for key, ctx in self.contexts.items() if ctx.ended is not None]
            for key in ended:
                self._drop(key)
            if ended:
                self._counts["contexts_ended_ttl"] += len(ended)
                self._replies.put(None)  # the writer flushes the counts

    def _drop(self, key: str) -> None:
        """Forget an ended context, remembering why (the caller holds the lock)."""
        context = self.contexts.pop(key)
        self._ended[key] = context.ended or "closed"
        if len(self._ended) > ENDED_REMEMBERED:
            self._ended.popitem(last=False)

    # -- replies ---------------------------------------------------------------------

    def _reply(self, request: ContextRequest, reply: ContextReply) -> None:
        self._replies.put((self.keys.context_reply(request.id), reply.encode()))

    def _write(self) -> None:
        while (item := self._replies.get()) is not _STOP:
            with self._lock:
                counts, self._counts = self._counts, Counter()
            give_up = time.monotonic() + REPLY_TTL_S
            failing = False
            while True:
                try:
                    with self.conn.pipeline(transaction=False) as pipe:
                        if item is not None:
                            key, data = item
                            pipe.rpush(key, data)
                            pipe.expire(key, REPLY_TTL_S)
                        for field, value in counts.items():
                            pipe.hincrby(self.keys.stats(), field, value)
                            pipe.hincrby(self.keys.worker_stats(self.host), field, value)
                        pipe.execute()
                    break
                except redis.RedisError as exc:
                    # An RPUSH that failed may have landed: a second copy waits unread
                    # on its own key, which expires.
                    if self._stop.is_set() or time.monotonic() >= give_up:
                        log.warning("worker %s: a context reply was lost: %s", self.host, exc)
                        break
                    if not failing:
                        log.warning("worker %s: writing a context reply: %s", self.host, exc)
                    failing = True
                    self._stop.wait(REPLY_RETRY_S)
