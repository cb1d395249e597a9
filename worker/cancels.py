"""What a dispatcher hears of cancellations: ``ledger.CANCEL`` publishes ``{batch}|all``
or ``{batch}|i,j`` on the channel of every dispatcher holding claims in the batch
(``Keys.cancel_channel``), and this dispatcher's listener thread hands each to the
batch's execution (worker/job.py), which drops what it has not started and has the
executor kill what runs. A push, not a poll: nothing is sent while nothing is cancelled,
and nothing is added to a snippet's path through Redis.

Pub/sub delivers only to a subscriber that is connected, so whenever the subscription
is (re)made the running executions look up their own indices in Redis once
(``BatchRunner.reconcile``): a cancellation made while the connection was down is found
there. What is heard is kept a while per batch (``CancelBook``), so a claim whose reply
comes after the message is still filtered before anything of it starts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import redis

from codepool.common.cancellation import parse_message

log = logging.getLogger(__name__)

# A cancellation is remembered this long after it was heard (a claim's reply, or a
# snippet's start, comes long before).
KEEP_S = 600.0
# How long the listener waits for a message before looking at its stop flag.
POLL_S = 1.0


class CancelBook:
    """Cancelled indices per batch (None: the whole batch), as heard. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._batches: dict[str, tuple[frozenset[int] | None, float]] = {}

    def add(self, batch_id: str, indices: frozenset[int] | None) -> None:
        now = time.monotonic()
        with self._lock:
            for old, (_, heard) in list(self._batches.items()):
                if now - heard > KEEP_S:
                    del self._batches[old]
            known = self._batches.get(batch_id)
            if known is not None and indices is not None:
                indices = None if known[0] is None else known[0] | indices
            self._batches[batch_id] = (indices, now)

    def cancelled(self, batch_id: str, index: int) -> bool:
        known = self._batches.get(batch_id)
        return known is not None and (known[0] is None or index in known[0])


class CancelListener:
    """A thread subscribed to ``channel``: ``on_cancel(batch_id, indices or None)`` for
    each cancellation, ``on_subscribed()`` each time the subscription is (re)made."""

    def __init__(
        self,
        conn: redis.Redis,
        channel: str,
        *,
        on_cancel: Callable[[str, frozenset[int] | None], None],
        on_subscribed: Callable[[], None],
    ) -> None:
        self.conn = conn
        self.channel = channel
        self.on_cancel = on_cancel
        self.on_subscribed = on_subscribed
        self._stop = threading.Event()
        self._subscribed = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="codepool-cancels", daemon=True)

    def start(self, timeout_s: float = 10.0) -> None:
        """Subscribe, and return once subscribed (at most ``timeout_s``): what is
        claimed afterwards cannot miss its cancellation."""
        self._thread.start()
        if not self._subscribed.wait(timeout_s):
            log.warning("%s: not subscribed after %.0f s; going on", self.channel, timeout_s)

    def close(self) -> None:
        """Stop listening. Not waited for: the thread holds nothing to flush, ends
        within ``POLL_S``, and must not hold up a dispatcher that stops."""
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            pubsub = self.conn.pubsub()  # type: ignore[no-untyped-call]
            try:
                pubsub.subscribe(self.channel)
                while not self._stop.is_set():
                    message = pubsub.get_message(timeout=POLL_S)
                    if message is not None:
                        self._take(message)
            except (redis.RedisError, OSError, ValueError) as exc:
                # OSError and ValueError: redis-py's, on a socket closed under the read
                # (the dispatcher closing its client as it stops).
                if self._stop.is_set():
                    return
                log.warning("%s: subscription lost, subscribing again: %s", self.channel, exc)
                self._stop.wait(0.5)
            finally:
                pubsub.close()

    def _take(self, message: dict[str, object]) -> None:
        kind = message.get("type")
        if kind == "subscribe":
            try:
                self.on_subscribed()
            finally:
                self._subscribed.set()
            return
        data = message.get("data")
        if kind != "message" or not isinstance(data, (bytes, str)):
            return
        parsed = parse_message(data)
        if parsed is None:
            log.warning("%s: ignoring malformed message %r", self.channel, data[:80])
            return
        self.on_cancel(*parsed)
