"""A producer's lone calls (common/lone_calls.py): one snippet at a time on the work
channel the fleet's hosts keep open, with no RQ job and no batch.

A call is one RPUSH onto the fleet's call list; its reply comes to this producer's
inbox, which one reader thread pops (BLMPOP, many replies per pop) and hands to the
calls' futures. So a call costs this side two commands or fewer, and any number of
concurrent callers share the one reader and the pool's connections: no thread or
connection per call. While calls wait, the reader looks at the fleet once a second
(``CodePool.watch``), which recovers the calls of a lapsed host, and a call with no
answer by its deadline comes back ``infra`` and is withdrawn (taken off the call list,
or cancelled where it runs).

A call its caller gives up on is taken off the call list if it still waits there (it
then never runs), else cancelled on whichever host runs it (pub/sub).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import Any, cast

import redis

from codepool.common import failover
from codepool.common.cancellation import CLOSED_MESSAGE
from codepool.common.codec import decode_result
from codepool.common.connection import redis_client
from codepool.common.context_requests import new_id
from codepool.common.errors import WireError
from codepool.common.limits import Limits
from codepool.common.lone_calls import LoneCall, decode_reply
from codepool.common.result import ExecResult, cancelled, infra
from codepool.common.settings import Settings
from codepool.common.snippet import Snippet
from codepool.common.tally import count_hashes

log = logging.getLogger(__name__)

READ_BLOCK_S = 1.0  # the reader's longest wait, between its looks at deadlines and the fleet
WAIT_BLOCK_S = 1.0  # a caller's wait per round trip (the pool's connections allow it)
READ_COUNT = 256  # replies per pop at most
DEADLINE_MARGIN_S = 300.0  # beyond a call's timeout: queueing, and a lost host's recovery


@dataclass(eq=False)
class _Waiting:
    future: Future[ExecResult]
    deadline: float
    raw: bytes
    run: str


class CallChannel:
    """Lone calls of one producer (``CodePool.calls``). Thread-safe."""

    def __init__(
        self,
        conn: redis.Redis,
        settings: Settings,
        *,
        name: str,
        watch: Callable[[], int | None],
    ) -> None:
        """conn: the producer's client (its pool of connections); name: the producer's,
        in logs; watch: a look at the fleet that recovers lapsed hosts (``CodePool.watch``)."""
        self.conn = conn
        self.settings = settings
        self.keys = settings.keys
        self.name = name
        self.watch = watch
        self.id = new_id()
        self.inbox = self.keys.inbox(self.id)
        self._conn = redis_client(settings, block_s=READ_BLOCK_S)
        self._lock = threading.Lock()
        self._waiting: dict[str, _Waiting] = {}
        self._wake = threading.Event()
        self._closed = False
        self._reader: threading.Thread | None = None

    def submit(
        self,
        code: str | Snippet,
        limits: Limits,
        *,
        run: str = "",
        deadline_s: float | None = None,
    ) -> Future[ExecResult]:
        """Send one snippet; the future resolves to its ExecResult. RedisError if it
        could not be sent."""
        return self.submit_many([(code, limits)], run=run, deadline_s=deadline_s)[0]

    def submit_many(
        self,
        calls: list[tuple[str | Snippet, Limits]],
        *,
        run: str = "",
        deadline_s: float | None = None,
    ) -> list[Future[ExecResult]]:
        """Send each (snippet, limits) as a lone call of its own, all in one command;
        futures in their order. RedisError if they could not be sent."""
        sent = [self._enter(code, limits, run, deadline_s, self.inbox) for code, limits in calls]
        try:
            failover.following(
                self.conn,
                lambda: self.conn.rpush(self.keys.calls(), *(raw for _, raw, _ in sent)),
                self._budget(sent),
            )
        except redis.RedisError:
            self._leave(sent)
            raise
        for call_id, _, future in sent:
            future.add_done_callback(functools.partial(self._given_up, call_id))
        return [future for _, _, future in sent]

    def run(
        self, code: str | Snippet, limits: Limits, *, run: str = "", deadline_s: float | None = None
    ) -> ExecResult:
        """Send one snippet and wait for its result on the caller's thread: the push
        and the wait go in one round trip, the answer to an inbox of its own.
        RedisError if it could not be sent."""
        # The thread's own inbox: its calls come one after another, so an answer there
        # that is not this call's is a late one to an earlier call, given up on.
        inbox = self.keys.inbox(f"{self.id}.{threading.get_ident()}")
        entered = self._enter(code, limits, run, deadline_s, inbox)
        _, raw, future = entered

        def send() -> Any:
            with self.conn.pipeline(transaction=False) as pipe:
                pipe.rpush(self.keys.calls(), raw)
                pipe.blpop([inbox], timeout=WAIT_BLOCK_S)
                return pipe.execute()[1]

        try:
            popped = failover.following(self.conn, send, self._budget([entered]))
        except redis.RedisError:
            self._leave([entered])
            raise
        while not future.done():  # overdue or closed: the reader says so
            if popped is not None:
                self._answer(cast(list[bytes], popped)[1])
                popped = None
                continue
            try:
                popped = self.conn.blpop([inbox], timeout=WAIT_BLOCK_S)
            except redis.RedisError as exc:
                log.warning("producer %s: waiting for a lone call: %s", self.name, exc)
                time.sleep(WAIT_BLOCK_S / 10)
        if future.cancelled():  # the pool closed meanwhile
            return cancelled(CLOSED_MESSAGE)
        return future.result()

    def _enter(
        self,
        code: str | Snippet,
        limits: Limits,
        run: str,
        deadline_s: float | None,
        inbox: str,
    ) -> tuple[str, bytes, Future[ExecResult]]:
        """Note a call as waiting (its deadline; the reader watches the fleet for it)."""
        if isinstance(code, Snippet):
            source, inputs = code.source, code.inputs_record()
        else:
            source, inputs = code, None
        call = LoneCall(new_id(), inbox, source, limits.to_dict(), inputs, run)
        raw, future = call.encode(), Future[ExecResult]()
        wait_s = limits.timeout_s + DEADLINE_MARGIN_S if deadline_s is None else deadline_s
        with self._lock:
            self._waiting[call.id] = _Waiting(future, time.monotonic() + wait_s, raw, run)
            if self._reader is None:
                self._reader = threading.Thread(
                    target=self._read, name="codepool-inbox", daemon=True
                )
                self._reader.start()
        self._wake.set()
        return call.id, raw, future

    def _budget(self, sent: list[tuple[str, bytes, Future[ExecResult]]]) -> float:
        """How long a send may follow the primary (common/failover.py): at most
        FOLLOW_S, and not past the first call's deadline."""
        with self._lock:
            waiting = self._waiting.get(sent[0][0]) if sent else None
        left = failover.FOLLOW_S if waiting is None else waiting.deadline - time.monotonic()
        return max(0.0, min(failover.FOLLOW_S, left))

    def _leave(self, sent: list[tuple[str, bytes, Future[ExecResult]]]) -> None:
        with self._lock:
            for call_id, _, _ in sent:
                self._waiting.pop(call_id, None)

    def waiting(self) -> int:
        with self._lock:
            return len(self._waiting)

    def close(self) -> None:
        """Give up on every call still waiting (they resolve ``cancelled``: what waits
        on the call list never runs, what runs is killed)."""
        with self._lock:
            self._closed = True
            waiting, self._waiting = self._waiting, {}
        for entry in waiting.values():
            entry.future.cancel()
        for call_id, entry in waiting.items():
            self._withdraw(call_id, entry)
        self._wake.set()
        if self._reader is not None:
            self._reader.join(timeout=READ_BLOCK_S + 1)
        self._conn.close()

    # -- replies ---------------------------------------------------------------------

    def _read(self) -> None:
        watched_at = time.monotonic()
        while True:
            with self._lock:
                if self._closed and not self._waiting:
                    return
                idle = not self._waiting
                if idle:
                    self._wake.clear()
            if idle:  # no Redis while nothing waits; a late answer waits in the inbox
                self._wake.wait()
                continue
            try:
                popped = self._conn.blmpop(
                    READ_BLOCK_S, 1, self.inbox, direction="LEFT", count=READ_COUNT
                )
            except (redis.RedisError, OSError) as exc:
                log.warning("producer %s: lone call replies: %s", self.name, exc)
                time.sleep(min(READ_BLOCK_S, 0.2))
                popped = None
            if popped is not None:
                for data in cast(list[Any], popped)[1]:
                    self._answer(data)
            now = time.monotonic()
            if now - watched_at >= READ_BLOCK_S:
                watched_at = now
                self._look_around(now)

    def _answer(self, data: bytes) -> None:
        try:
            call_id, blob = decode_reply(data)
            result = decode_result(blob)
        except WireError as exc:
            log.error("producer %s: dropped a malformed reply: %s", self.name, exc)
            return
        with self._lock:
            entry = self._waiting.pop(call_id, None)
        if entry is not None:  # else a second answer (a host that came back), or given up
            _settle(entry.future, result)

    def _look_around(self, now: float) -> None:
        """Recover lapsed hosts' calls (the pool's janitor) and end overdue calls."""
        with self._lock:
            if not self._waiting:
                return
            overdue = [(i, e) for i, e in self._waiting.items() if e.deadline <= now]
            for call_id, _ in overdue:
                del self._waiting[call_id]
        for call_id, entry in overdue:
            message = "codepool: no answer to this call by its deadline"
            _settle(entry.future, infra(message, worker=self.name))
            # Nobody waits for it now: off the call list if it still waits there (the
            # chaos run, finding 8), else killed where it runs; as a batch's deadline does.
            self._withdraw(call_id, entry)
        self.watch()

    # -- giving up -------------------------------------------------------------------

    def _given_up(self, call_id: str, future: Future[ExecResult]) -> None:
        # On the canceller's thread (maybe an event loop's): the Redis part goes to a
        # thread of its own, as cancellations are rare.
        if not future.cancelled():
            return
        with self._lock:
            entry = self._waiting.pop(call_id, None)
        if entry is not None:
            threading.Thread(
                target=self._withdraw, args=(call_id, entry), name="codepool-withdraw", daemon=True
            ).start()

    def _withdraw(self, call_id: str, entry: _Waiting) -> None:
        conn = self.conn
        try:
            # Still waiting on the call list: it never runs, and it is counted here.
            if conn.lrem(self.keys.calls(), 1, entry.raw):  # type: ignore[arg-type]
                with conn.pipeline(transaction=False) as pipe:
                    hashes = count_hashes(self.keys, "", entry.run)
                    for key in hashes:
                        pipe.hincrby(key, "cancelled", 1)
                    pipe.expire(hashes[1], self.settings.minute_stats_ttl_s)
                    pipe.execute()
            else:  # taken: its host kills it and counts it
                conn.publish(self.keys.calls_cancel_channel(), call_id)
        except redis.RedisError as exc:
            log.warning("producer %s: could not withdraw a lone call: %s", self.name, exc)


def _settle(future: Future[ExecResult], result: ExecResult) -> None:
    try:
        future.set_result(result)
    except InvalidStateError:
        pass  # given up on meanwhile
