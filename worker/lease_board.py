"""What a worker host's beat learned, for its dispatchers to read without asking Redis.

The worker host holds the leases of all its dispatchers (worker/lease.py); each
dispatcher must still know, before it writes a result, whether its own lease certainly
holds. The host says so in a small file in its private dir, mapped by every dispatcher:
a header with the monotonic time the last beat Redis answered was sent and the live hosts
from the last janitor's round, then one cell per dispatcher slot with the state of the
lease of the dispatcher in that slot. Only the host writes; CLOCK_MONOTONIC is the
same clock in every process of the host.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
import time

# The last answered beat (monotonic ns), live hosts, moves of a Sentinel's primary the
# host's watcher saw (its processes follow it: common/failover.follow).
HEADER = struct.Struct("<qii")
CELL = struct.Struct("<i")  # the slot's lease state

EMPTY = 0  # no dispatcher in the slot
PENDING = 1  # started; its lease is not taken yet
HELD = 2  # its lease holds as of the last answered beat
LOST = 3  # fenced: its work was released elsewhere


class LeaseBoard:
    """The board at ``path`` for ``dispatchers`` slots; ``create`` makes it anew
    (the host), else it is opened as it is (a dispatcher)."""

    def __init__(self, path: str, dispatchers: int, *, create: bool = False) -> None:
        size = HEADER.size + CELL.size * dispatchers
        flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT | os.O_TRUNC if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.write(fd, bytes(size))
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.dispatchers = dispatchers
        self._writing = threading.Lock()  # the host's lease and watcher threads write

    def answered(self, live: int | None, *, sent_ns: int | None = None) -> None:
        """A beat was answered (and a janitor's round counted ``live`` hosts): the
        lease is renewed as of when that beat was sent, ``sent_ns`` (monotonic; default
        now), not when its reply came: a reply held up by a stalled Redis or network
        renewed the lease at the server before it arrived here."""
        if live is None:
            live = self.live()
        at_ns = time.monotonic_ns() if sent_ns is None else sent_ns
        with self._writing:
            HEADER.pack_into(self._map, 0, at_ns, live, self.primary_moves())

    def age_s(self) -> float:
        """Seconds since the last answered beat."""
        last_ns = HEADER.unpack_from(self._map, 0)[0]
        return (time.monotonic_ns() - last_ns) / 1e9 if last_ns else float("inf")

    def live(self) -> int:
        return max(1, int(HEADER.unpack_from(self._map, 0)[1]))

    def primary_moved(self) -> None:
        """The host's Sentinel watcher saw the primary move."""
        with self._writing:
            last_ns, live, moves = HEADER.unpack_from(self._map, 0)
            HEADER.pack_into(self._map, 0, last_ns, live, moves + 1)

    def primary_moves(self) -> int:
        return int(HEADER.unpack_from(self._map, 0)[2])

    def set(self, slot: int, state: int) -> None:
        CELL.pack_into(self._map, HEADER.size + CELL.size * slot, state)

    def state(self, slot: int) -> int:
        return int(CELL.unpack_from(self._map, HEADER.size + CELL.size * slot)[0])

    def close(self) -> None:
        self._map.close()
