"""The worker host's call server: it runs lone calls (common/lone_calls.py) from the
fleet's call list on the host's executor, with no RQ job per call.

One thread takes calls: while the host has a free slot for one (or PREFETCH more), a blocking BLMOVE
moves the oldest waiting call onto the host's in-flight list (an idle host costs Redis
one command every BLOCK_S). Each call goes to the executor without waiting for it; its
reply goes out from one writer thread, which in one round trip pushes what finished
meanwhile to its producers' inboxes and takes it off the in-flight list. What those
replies add to the counters goes in the same round trip, onto the start's pending list
(common/lone_counts.py), folded into the counters at most once a FLUSH_S (or by a
janitor if the host dies first). A third thread hears cancellations
(pub/sub) and kills the call it names if it runs here.

Stopping: ``halt`` (the host's first signal) takes no more calls; ``stop`` waits for
what runs until the drain deadline, then puts what is left back on the call list for
another host, so a clean stop loses no call and a crash loses none either (a janitor
puts a lapsed host's in-flight calls back).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from typing import Any, cast

import redis

from codepool.common import lone_counts
from codepool.common.connection import redis_client
from codepool.common.errors import CodepoolError, ConfigError, WireError
from codepool.common.limits import Limits
from codepool.common.lone_calls import INBOX_TTL_S, LoneCall, encode_reply
from codepool.common.result import CANCELLED, ExecResult, infra, rejected
from codepool.common.settings import Settings
from codepool.common.snippet import Snippet
from codepool.worker.engine.executor import LocalExecutor

log = logging.getLogger(__name__)

BLOCK_S = 10
FLUSH_S = 1.0
RESEND_S = 0.5  # replies a write could not send are sent again this often
PREFETCH = 1  # calls taken beyond the host's slots
_STOP = object()
_FLUSH = object()  # counts go out with the next write, not after FLUSH_S


class CallServer:
    """Runs lone calls for host ``host`` on ``executor``, at most ``slots`` at a time;
    ``start``: the host's start (``host~{token}``, worker/lease.py), what its calls in
    flight are listed under, so a start of the same name never takes them for its own
    (default ``host``)."""

    def __init__(
        self,
        settings: Settings,
        executor: LocalExecutor,
        *,
        host: str,
        slots: int,
        start: str = "",
    ) -> None:
        self.settings = settings
        self.keys = settings.keys
        self.executor = executor
        self.host = host
        self.inflight_key = self.keys.host_calls(start or host)
        self.start_name = start or host
        self.counts_key = self.keys.host_call_counts(self.start_name)
        # What was pushed onto the pending list since the last fold (writer thread
        # only): the fold adds these up, not the list, which a failover may have lost.
        self._owed: list[str] = []
        # Its host's watcher follows a Sentinel's primary for them (worker/host.py).
        self._taker_conn = redis_client(settings, block_s=BLOCK_S, watch_s=None)
        self.conn = redis_client(settings, watch_s=None)
        self.clients = (self._taker_conn, self.conn)
        # A call more than the slots waits at the supervisor, so a freed slot starts
        # the next call at once instead of after a round trip to Redis.
        self._room = threading.Semaphore(max(1, slots) + PREFETCH)
        self._running: dict[str, tuple[LoneCall, Future[ExecResult]]] = {}
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._replies: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._halted = threading.Event()
        self._abandoned = False  # past the drain: results are not written any more
        self._threads = [
            threading.Thread(target=self._take, name="codepool-calls", daemon=True),
            threading.Thread(target=self._write, name="codepool-call-replies", daemon=True),
            threading.Thread(target=self._hear, name="codepool-call-cancels", daemon=True),
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def halt(self) -> None:
        """Take no more calls (signal-handler safe)."""
        self._halted.set()

    def running(self) -> int:
        with self._lock:
            return len(self._running)

    def stop(self, *, until: float | None = None) -> None:
        """Stop taking calls, let what runs finish until ``until`` (monotonic), then put
        what is left back on the call list and stop."""
        self._halted.set()
        try:
            self._taker_conn.close()  # ends a BLMOVE that waits
        except Exception:  # closing a connection another thread uses
            pass
        with self._idle:
            while self._running and (until is None or time.monotonic() < until):
                self._idle.wait(min(0.1, max(0.0, (until or 0) - time.monotonic()) or 0.1))
            self._abandoned = True
            left = len(self._running)
        self._replies.put(_STOP)
        self._threads[1].join(timeout=5)
        try:
            if self._owed:
                lone_counts.fold(self.conn, self.keys, self.start_name, self._owed)
        except redis.RedisError as exc:  # a janitor folds them when the lease lapses
            log.warning("worker %s: lone call counts wait for the janitor: %s", self.host, exc)
        try:
            # What this host still holds goes back first in line, in its order.
            moved = 0
            while self.conn.lmove(self.inflight_key, self.keys.calls(), "RIGHT", "LEFT"):
                moved += 1
            if moved or left:
                log.warning(
                    "worker %s: stopping; %d lone calls back on the call list", self.host, moved
                )
        except redis.RedisError as exc:
            log.warning("worker %s: could not give back lone calls: %s", self.host, exc)
        self.conn.close()

    # -- taking calls ----------------------------------------------------------------

    def _take(self) -> None:
        calls_key = self.keys.calls()
        while not self._halted.is_set():
            if not self._room.acquire(timeout=1.0):
                continue
            try:
                data = self._taker_conn.blmove(
                    calls_key, self.inflight_key, BLOCK_S, "LEFT", "RIGHT"
                )
            except (redis.RedisError, OSError, ValueError) as exc:
                self._room.release()
                if self._halted.is_set():
                    return
                log.warning("worker %s: lone calls: %s", self.host, exc)
                self._halted.wait(1.0)
                continue
            if data is None:
                self._room.release()
                continue
            data = cast(bytes, data)
            if self._halted.is_set():  # taken as the host stopped: back, first in line
                self._give_back(data)
                return
            self._start(data)

    def _give_back(self, data: bytes) -> None:
        try:
            with self.conn.pipeline(transaction=True) as pipe:
                pipe.lrem(self.inflight_key, 1, data)  # type: ignore[arg-type]
                pipe.lpush(self.keys.calls(), data)
                pipe.execute()
        except redis.RedisError as exc:
            log.warning("worker %s: a lone call waits for the janitor: %s", self.host, exc)

    def _start(self, data: bytes) -> None:
        try:
            call = LoneCall.decode(data)
        except WireError as exc:
            log.error("worker %s: dropped a malformed lone call: %s", self.host, exc)
            self._replies.put((None, data, None))  # off the in-flight list
            self._room.release()
            return
        try:
            limits = Limits.from_dict(call.limits)
            code: str | Snippet = call.code
            if call.inputs is not None:
                code = Snippet.from_record(call.code, call.inputs)
        except (ConfigError, WireError, TypeError, ValueError) as exc:
            self._finish(call, rejected(f"rejected: {exc}", worker=self.executor.name))
            return
        try:
            future = self.executor.submit_limited(code, limits)
        except CodepoolError as exc:
            self._finish(call, infra(f"codepool: executor failed: {exc}", worker=self.host))
            return
        with self._lock:
            self._running[call.id] = (call, future)
        future.add_done_callback(lambda done: self._ran(call, done))

    def _ran(self, call: LoneCall, future: Future[ExecResult]) -> None:
        try:
            result = future.result()
        except Exception as exc:  # the executor's own failure: the caller hears it
            result = infra(f"codepool: executor failed: {exc}", worker=self.executor.name)
        self._finish(call, result)

    def _finish(self, call: LoneCall, result: ExecResult) -> None:
        with self._idle:
            self._running.pop(call.id, None)
            abandoned = self._abandoned
            self._idle.notify_all()
        self._room.release()
        if not abandoned:  # else it goes back on the call list with the stop
            self._replies.put((call, call.raw, result))
            if result.status == CANCELLED:  # rare, and a caller may look at once
                self._replies.put(_FLUSH)

    # -- replies ---------------------------------------------------------------------

    def _write(self) -> None:
        flush_at = time.monotonic() + FLUSH_S
        stopping = False
        unsent: list[Any] = []  # replies a write could not send: sent again until they go
        while not stopping:
            batch: list[Any] = []
            wait_s = flush_at - time.monotonic()
            if unsent:
                wait_s = min(wait_s, RESEND_S)
            try:
                batch.append(self._replies.get(timeout=max(0.0, wait_s)))
                while True:  # what finished meanwhile goes in the same round trip
                    batch.append(self._replies.get_nowait())
            except queue.Empty:
                pass
            stopping = _STOP in batch
            now = time.monotonic()
            due = now >= flush_at or stopping or _FLUSH in batch
            if due:
                flush_at = now + FLUSH_S
            replies = unsent + [item for item in batch if item is not _STOP and item is not _FLUSH]
            unsent = [] if self._send(replies, due) else replies
            if unsent and not stopping:
                time.sleep(RESEND_S / 5)  # not a busy loop while Redis is away

    def _send(self, replies: list[Any], due: bool) -> bool:
        """Push ``replies`` with their counts; ``due``: fold the pending counts too.
        False if Redis could not be reached: they are to be sent again (as redis-py's
        own retries of the pipeline do; a second answer is dropped by its producer)."""
        if not replies and not (due and self._owed):
            return True
        inboxes: set[str] = set()
        pending = lone_counts.entries(
            self.keys,
            self.host,
            ((call.run, result) for call, _, result in replies if call is not None),
            minute_ttl_s=self.settings.minute_stats_ttl_s,
        )
        try:
            with self.conn.pipeline(transaction=False) as pipe:
                for call, raw, result in replies:
                    if call is not None:
                        pipe.rpush(call.inbox, encode_reply(call.id, result))
                        inboxes.add(call.inbox)
                    pipe.lrem(self.inflight_key, 1, raw)
                # Every push: an inbox its reader emptied went with its TTL, and the
                # push made it anew without one (docs/chaos.md, finding 3).
                for inbox in inboxes:
                    pipe.expire(inbox, INBOX_TTL_S)
                # The counts ride with the replies: a kill -9 after this round trip
                # loses none of them (docs/chaos.md, finding 5).
                if pending:
                    pipe.rpush(self.counts_key, *pending)
                owed = self._owed + pending
                fold = due and bool(owed)
                if fold:
                    args = lone_counts.fold_args(owed)
                    lone_counts.fold_script.queue(pipe, [self.counts_key], args)
                pipe.execute()
            self._owed = [] if fold else owed
        except redis.exceptions.NoScriptError:  # a restarted Redis: the rest went
            self._owed = owed
            try:
                lone_counts.fold_script.load(self.conn)
            except redis.RedisError:
                pass
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            # Sent again until Redis takes them (docs/chaos.md, finding 8: a host that
            # lived through the outage never lapses, so nothing else would answer).
            # Stopping, the calls stay on the in-flight list, which goes back on the
            # call list: they run again elsewhere.
            log.warning("worker %s: %d lone call replies wait: %s", self.host, len(replies), exc)
            return False
        except redis.RedisError as exc:  # refused by Redis: sending again would not help
            log.warning("worker %s: %d lone call replies lost: %s", self.host, len(replies), exc)
        return True

    # -- cancellations -----------------------------------------------------------------

    def _hear(self) -> None:
        while not self._halted.is_set() or self.running():
            try:
                pubsub = self.conn.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
                pubsub.subscribe(self.keys.calls_cancel_channel())
                while not self._abandoned:
                    message = pubsub.get_message(timeout=1.0)
                    if message is not None:
                        self._cancel(message["data"])
                pubsub.close()
                return
            except (redis.RedisError, OSError, ValueError) as exc:
                if self._abandoned:
                    return
                log.warning("worker %s: lone call cancellations: %s", self.host, exc)
                time.sleep(1.0)

    def _cancel(self, data: Any) -> None:
        call_id = data.decode() if isinstance(data, bytes) else str(data)
        with self._lock:
            held = self._running.get(call_id)
        if held is not None:
            self.executor.cancel(held[1])
