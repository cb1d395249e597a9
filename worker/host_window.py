"""The host's executor slots, shared by its dispatchers.

A batch is announced to a host once, so the one dispatcher that joins it must be able
to use the whole host: each dispatcher keeps its share (``ceil(N / K)`` running plus one
waiting, what it had on its own before), and may borrow what its siblings leave unused,
up to the host's capacity (``N + K`` in the executor: every slot busy and one waiting
per dispatcher, as when all K run their shares). A straggler still holds one slot, not
the host: the dispatcher holding it waits, and its siblings take the next batches.

The counts live in a small file in the host's private dir, one cell per dispatcher
slot, mapped by every dispatcher: each writes only its own cell and reads the others'.
A cell holds the dispatcher's snippets in the executor (32 bits) and the id of the batch
it runs (32 bytes, zeros when it runs none): a dispatcher that looks for open batches to
join (worker/dispatcher.py) leaves those its host runs already. The figures are advisory
(two dispatchers may both see the last free place), so the host never holds more than a
few beyond its capacity.
"""

from __future__ import annotations

import math
import mmap
import os
import struct

BATCH_ID_BYTES = 32  # new_batch_id: 32 hex digits
COUNT = struct.Struct("<i")
CELL = struct.Struct(f"<i{BATCH_ID_BYTES}x")  # a cell; iter_unpack reads every count at once
BATCH_ID = struct.Struct(f"{BATCH_ID_BYTES}s")  # after the count


def create(path: str, dispatchers: int) -> None:
    """Make the (zeroed) counts file for ``dispatchers`` slots."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, bytes(CELL.size * dispatchers))
    finally:
        os.close(fd)


def share_of(slots: int, dispatchers: int) -> int:
    """What each of ``dispatchers`` keeps in the executor for itself."""
    return math.ceil(slots / max(1, dispatchers)) + 1


class HostWindow:
    """One dispatcher's view of its host's slots.

    path: the counts file (``create``); slot: this dispatcher's cell; slots: the
    executor's concurrency N; dispatchers: K, the host's dispatcher count.
    """

    def __init__(self, path: str, *, slot: int, slots: int, dispatchers: int) -> None:
        self.slot = slot
        self.dispatchers = dispatchers
        self.share = share_of(slots, dispatchers)
        self.capacity = slots + dispatchers
        self._cells = dispatchers
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            self._map = mmap.mmap(fd, CELL.size * dispatchers)
        finally:
            os.close(fd)
        self.publish(0)

    def publish(self, own: int) -> None:
        """This dispatcher has ``own`` snippets in the executor now."""
        COUNT.pack_into(self._map, CELL.size * self.slot, own)

    def running(self, batch_id: str | None) -> None:
        """This dispatcher runs batch ``batch_id`` now (None: none)."""
        raw = batch_id.encode()[:BATCH_ID_BYTES] if batch_id else b""
        BATCH_ID.pack_into(self._map, CELL.size * self.slot + COUNT.size, raw)

    def hosted(self) -> set[str]:
        """The batches this host's dispatchers run now."""
        offsets = range(COUNT.size, CELL.size * self._cells, CELL.size)
        raw = (BATCH_ID.unpack_from(self._map, at)[0].rstrip(b"\0") for at in offsets)
        return {batch.decode(errors="replace") for batch in raw if batch}

    def room(self, own: int) -> int:
        """How many more this dispatcher may start, holding ``own``: up to its share,
        and beyond it what the host's capacity leaves."""
        total: int = sum(value for (value,) in CELL.iter_unpack(self._map))
        return max(self.share - own, self.capacity - total)

    def close(self) -> None:
        self.publish(0)
        self.running(None)
        self._map.close()


def clear(path: str, slot: int) -> None:
    """Zero a dead dispatcher's cell (the worker host does it before starting another)."""
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        os.pwrite(fd, bytes(CELL.size), CELL.size * slot)
    finally:
        os.close(fd)
