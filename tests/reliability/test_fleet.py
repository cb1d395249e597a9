"""The fleet as one pool, on real separate hosts: three worker hosts, each in a network
namespace of its own, reach the test's redis-server over veth pairs. One batch spreads
over all of them; a host killed -9, frozen (SIGSTOP) or cut off mid-batch costs its
lease, not the batch. The producer's deadline stays at its default (minutes), far past
these tests' waits, so only the lease path can finish the batch in time."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from rq import Worker
from rq.registry import StartedJobRegistry

from codepool.common import counters
from codepool.common.codec import MsgpackSerializer
from codepool.common.keys import Keys
from codepool.common.ledger import leased_dispatchers
from codepool.common.settings import Settings
from codepool.ops.bench.netns import Fleet, netns_available
from codepool.producer import CodePool
from tests.conftest import wait_until

pytestmark = pytest.mark.skipif(netns_available() is not None, reason=str(netns_available()))

HOSTS = 3
SLEEP_S = 0.2
WAIT_S = 120.0  # the test's own bound; the batch deadline is 60 s + 5 s per snippet


class Hosts:
    """A started fleet: its Redis, its hosts' logs, and a producer on it."""

    def __init__(self, fleet: Fleet, logs: Path) -> None:
        self.fleet = fleet
        self.logs = logs
        self.url = fleet.redis_unix_url
        self.conn = redis.Redis.from_url(self.url)
        self.pool = CodePool(self.url)
        self.keys = Keys()

    def start(self, index: int) -> None:
        self.fleet.start_worker(index, name=f"h{index}", log_path=self.log_path(index))

    def log_path(self, index: int) -> Path:
        return self.logs / f"h{index}.log"

    def log(self, index: int) -> str:
        return self.log_path(index).read_text(errors="replace")

    def live_dispatchers(self, index: int) -> int:
        """Dispatchers of host ``index`` holding a lease right now."""
        return len(leased_dispatchers(self.conn, self.keys, f"h{index}", Settings().lease_s))

    def listening(self, index: int) -> bool:
        """A dispatcher of host ``index`` waits on the queue (one per host does, so each
        host takes one of a batch's announcements)."""
        addr = f"10.250.{index}.2:"
        clients = self.conn.client_list()
        return any(c["cmd"] == "blmove" and c["addr"].startswith(addr) for c in clients)

    def ready(self, index: int) -> bool:
        return self.live_dispatchers(index) >= 2 and self.listening(index)

    def wait(self, what: str, check: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
        def said() -> str:
            logs = "\n".join(f"--- h{i}\n{self.log(i)[-3000:]}" for i in range(HOSTS))
            return f"{what}\n{logs}"

        wait_until(check, timeout_s, said)

    def counted(self) -> int:
        return counters.parse(self.conn.hgetall(self.keys.stats())).get("calls", 0)


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[Hosts]:
    with Fleet(hosts=HOSTS) as fleet:
        started = Hosts(fleet, tmp_path)
        for index in range(HOSTS):
            started.start(index)
        for index in range(HOSTS):
            started.wait(f"host {index}", lambda i=index: started.ready(i))
        yield started
        started.pool.close()


def _codes(n: int) -> list[str]:
    return [f"import time\ntime.sleep({SLEEP_S})\nprint({i})" for i in range(n)]


def _run_with_fault(
    hosts: Hosts, n: int, fault: Callable[[int], object]
) -> tuple[list[int], int, str]:
    """Submit n snippets, apply ``fault`` to the host that is busiest once a sixth are
    done, and collect every index; returns the indices as they came, that host's index
    and the batch id."""
    batch = hosts.pool.submit(_codes(n), timeout_s=5.0)
    seen: list[int] = []
    by_host: Counter[str] = Counter()
    iterator = batch.as_completed(timeout_s=WAIT_S)
    for index, result in iterator:
        seen.append(index)
        by_host[result.worker] += 1
        if len(seen) == n // 6:
            break
    victim = int(by_host.most_common(1)[0][0][1:])
    fault(victim)
    seen += [index for index, _ in iterator]
    return seen, victim, batch.id


def _check_batch(hosts: Hosts, seen: list[int], n: int) -> None:
    assert sorted(seen) == list(range(n)), "every index exactly once"
    hosts.wait("every snippet counted once", lambda: hosts.counted() >= n, timeout_s=30)
    assert hosts.counted() == n


def test_one_batch_spreads_over_every_host(hosts: Hosts) -> None:
    n = 60
    results = hosts.pool.submit(_codes(n), timeout_s=5.0).results(timeout_s=WAIT_S)
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(n)]
    per_host = Counter(r.worker for r in results)
    assert set(per_host) == {"h0", "h1", "h2"}
    # Work stealing keeps the shares close: no host does twice its fair third.
    assert max(per_host.values()) <= 2 * n // HOSTS, per_host
    hosts.wait("counts", lambda: hosts.counted() >= n, timeout_s=30)
    assert hosts.counted() == n


def test_a_host_killed_mid_batch_costs_its_lease_not_the_batch(hosts: Hosts) -> None:
    n = 120
    seen, victim, _ = _run_with_fault(hosts, n, hosts.fleet.kill_host)
    _check_batch(hosts, seen, n)
    # RQ hygiene: the dead host's dispatchers are gone from RQ's worker list, and none
    # of the batch's announcements is left in RQ's started registry.
    names = [w.name for w in Worker.all(connection=hosts.conn)]
    assert not [name for name in names if name.startswith(f"h{victim}.")], names
    started = StartedJobRegistry("codepool", connection=hosts.conn, serializer=MsgpackSerializer)
    hosts.wait("started registry empty", lambda: started.get_job_ids() == [], timeout_s=30)


def test_a_frozen_host_that_thaws_drops_its_late_results(hosts: Hosts) -> None:
    n = 120
    seen, index, batch_id = _run_with_fault(hosts, n, hosts.fleet.freeze_host)
    _check_batch(hosts, seen, n)
    hosts.fleet.thaw_host(index)
    # It notices it was fenced, drops what its frozen snippets produced, and comes back
    # with fresh dispatchers.
    hosts.wait("late results dropped", lambda: "dropped" in hosts.log(index))
    hosts.wait("host back", lambda: hosts.ready(index))
    assert "lease lapsed" in hosts.log(index)
    # Nothing it ran reached the done list after the producer had drained it.
    assert hosts.conn.llen(hosts.keys.batch_done(batch_id)) == 0
    assert hosts.counted() == n
    _serves_everywhere(hosts, n)


def test_a_host_cut_off_mid_batch_then_reconnected(hosts: Hosts) -> None:
    n = 120
    seen, index, batch_id = _run_with_fault(hosts, n, hosts.fleet.cut_link)
    _check_batch(hosts, seen, n)
    hosts.fleet.restore_link(index)
    hosts.wait("host back", lambda: hosts.ready(index), timeout_s=90)
    assert hosts.conn.llen(hosts.keys.batch_done(batch_id)) == 0
    assert hosts.counted() == n
    _serves_everywhere(hosts, n)


def _serves_everywhere(hosts: Hosts, counted_before: int) -> None:
    n = 60
    results = hosts.pool.submit(_codes(n), timeout_s=5.0).results(timeout_s=WAIT_S)
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(n)]
    assert set(Counter(r.worker for r in results)) == {"h0", "h1", "h2"}
    hosts.wait("counts", lambda: hosts.counted() >= counted_before + n, timeout_s=30)
    assert hosts.counted() == counted_before + n


def test_a_context_whose_host_is_killed_is_rebuilt_on_another_with_its_state(
    hosts: Hosts,
) -> None:
    ctx = hosts.pool.context(timeout_s=10.0)
    victim = int(ctx.host[1:])
    assert ctx.run_code("import numpy as np\nrows = np.arange(6).reshape(2, 3)").ok
    assert ctx.run_code("def total():\n    return int(rows.sum())").ok
    assert ctx.run_code("print(total())").stdout == "15\n"
    hosts.fleet.kill_host(victim)  # kill -9 of the host's whole process tree
    rebuilt = ctx.run_code("rows = rows * 2\nprint(total())")
    assert rebuilt.status == "ok" and rebuilt.stdout == "30\n" and rebuilt.rebuilt, rebuilt
    assert ctx.host != f"h{victim}" and ctx.rebuilds == 1
    assert ctx.run_code("print(total())").stdout == "30\n"
    ctx.close()
