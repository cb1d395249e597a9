"""What a batch or a remote context reaches its pool by (producer/pool.py's ``CodePool``
is the one implementation). A protocol, so that batch.py and context.py need not import
the pool that makes them."""

from __future__ import annotations

from typing import Protocol

import redis

from codepool.common.keys import Keys
from codepool.common.settings import Settings
from codepool.producer.lease import ProducerLease


class Stored(Protocol):
    """A submitted batch as it was stored, to store it again after a failover."""

    id: str
    size: int
    run: str
    spec: bytes
    reruns: int


class PoolView(Protocol):
    settings: Settings
    keys: Keys
    conn: redis.Redis
    collect: redis.Redis  # short timeouts, no retries: what a collection reads with
    lease: ProducerLease

    @property
    def closed(self) -> bool:
        """The pool was closed: its collections cancel what they still miss."""
        ...

    def want_spare(self) -> None:
        """A batch's results are in: the next batch's id and announcement may be made."""
        ...

    def nudge(self, batch_id: str, size: int) -> bool: ...

    def recover(self, batch: Stored) -> bool: ...

    def watch(self) -> int | None: ...
