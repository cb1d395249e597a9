"""A dispatcher's writer trusts its lease for the lease less a margin from the last
answered beat: counted from when that beat was *sent*, not from when its reply came.
A beat that Redis held up (here by a busy script, as a stall or a slow link would) renewed
the lease at the server when it was sent; trusting it from its late reply would stretch
the trust past the lease (before: the age was counted from the reply, about 0 s)."""

from __future__ import annotations

import threading
from pathlib import Path

import redis

from codepool.common.settings import Settings
from codepool.worker.lease import HostLease
from codepool.worker.lease_board import HELD, LeaseBoard
from tests.conftest import wait_until

STALL_S = 1.5
# Redis runs nothing else while a script runs (within its busy-script limit, 5 s).
BUSY = """
local t = redis.call('TIME')
local till = tonumber(t[1]) + tonumber(t[2]) / 1e6 + tonumber(ARGV[1])
repeat
  t = redis.call('TIME')
until tonumber(t[1]) + tonumber(t[2]) / 1e6 >= till
return 0
"""


def test_lease_trust_counts_from_when_the_beat_was_sent(redis_url: str, tmp_path: Path) -> None:
    conn = redis.Redis.from_url(redis_url)
    board = LeaseBoard(str(tmp_path / "leases"), 1, create=True)
    lease = HostLease(
        conn, Settings(redis_url=redis_url), host="h", slots=1, board=board, on_lost=lambda _: None
    )
    lease.add(0, "h.0.x")
    lease.tick()
    assert board.state(0) == HELD
    stall = threading.Thread(target=lambda: redis.Redis.from_url(redis_url).eval(BUSY, 0, STALL_S))
    stall.start()
    wait_until(lambda: _stalled(redis_url), what="Redis stalled")
    lease._next_beat = 0.0  # a beat is due: it waits out the stall
    lease.tick()
    stall.join()
    # The beat left before the stall ended; its reply came after it.
    assert board.age_s() >= STALL_S * 0.5, board.age_s()
    board.close()
    conn.close()


def _stalled(url: str) -> bool:
    """A command of another client finds Redis busy (it times out)."""
    probe = redis.Redis.from_url(url, socket_timeout=0.2)
    try:
        probe.ping()
        return False
    except redis.TimeoutError:
        return True
    finally:
        probe.close()
