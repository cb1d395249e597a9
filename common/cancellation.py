"""Giving up on snippets: the cancellation of a whole batch or of some of its indices.

Whoever gives up (a producer's ``Batch.cancel``, a cancelled ``arun_code``, a closed
sandbox, a janitor for a lapsed producer) runs ``ledger.CANCEL`` once: it writes the
cancellation as the result of every index that has none yet (first write wins, so a
run's result that comes later is never written, nor counted), counts those indices as
``cancelled``, pushes them to the done list and tells the dispatchers holding claims in
the batch on their channels (``Keys.cancel_channel``), so what they have not started
never starts and what runs is killed. Nothing here needs a worker: ``common`` code.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import redis

from codepool.common import codec
from codepool.common.ledger import cancel_script
from codepool.common.queueing import withdraw_announcements
from codepool.common.result import cancelled
from codepool.common.settings import Settings
from codepool.common.tally import count_hashes

WHOLE = "all"
GAVE_UP_MESSAGE = "codepool: cancelled: the caller gave up on this snippet"
CLOSED_MESSAGE = "codepool: cancelled: the sandbox was closed before this snippet finished"
PRODUCER_LOST_MESSAGE = (
    "codepool: cancelled: the producer that submitted this batch stopped heartbeating "
    "(its lease lapsed)"
)


def cancel(
    conn: redis.Redis,
    settings: Settings,
    batch_id: str,
    indices: Iterable[int] | None = None,
    *,
    run: str,
    message: str = GAVE_UP_MESSAGE,
    withdraw: Sequence[str] = (),
) -> int:
    """Cancel the whole batch (``indices`` None) or those of its indices that have no
    result yet; returns how many were newly cancelled (-1: the batch is gone). ``run``
    is the batch's run tag (its counter hash). ``withdraw``: announcements (RQ job ids)
    to take off the queue with it, in the same round trip, when nothing of the batch
    is wanted any more. Raises redis.RedisError."""
    keys = settings.keys
    blob = codec.encode_result(cancelled(message))
    call_keys = [
        keys.batch_state(batch_id),
        keys.batch_results(batch_id),
        keys.batch_done(batch_id),
        keys.batch_retry(batch_id),
        keys.open_batches(),
        *count_hashes(keys, "", run),
    ]
    args: list[Any] = [
        settings.batch_ttl_s,
        settings.minute_stats_ttl_s,
        blob,
        codec.dumps(blob),
        batch_id,
        keys.cancel_channel(""),
        WHOLE if indices is None else "",
    ]
    if indices is not None:
        chosen = sorted(set(indices))
        if not chosen:
            return 0
        args += chosen
    if not withdraw:
        return int(cancel_script(conn, call_keys, args))
    with conn.pipeline(transaction=False) as pipe:
        cancel_script.queue(pipe, call_keys, args)
        withdraw_announcements(pipe, settings, withdraw)
        try:
            return int(pipe.execute()[0])
        except redis.exceptions.NoScriptError:
            cancel_script.load(conn)
            return cancel(conn, settings, batch_id, indices, run=run, message=message)


def parse_message(data: bytes | str) -> tuple[str, frozenset[int] | None] | None:
    """A cancel channel's message: (batch id, its cancelled indices, or None for the
    whole batch); None when it is not one."""
    text = data.decode() if isinstance(data, bytes) else data
    batch_id, sep, rest = text.partition("|")
    if not sep or not batch_id:
        return None
    if rest == WHOLE:
        return batch_id, None
    try:
        return batch_id, frozenset(int(i) for i in rest.split(",") if i)
    except ValueError:
        return None
