"""A cold fleet spreads: a batch submitted while the worker hosts are still starting runs
on every one of them, and a host that starts while a batch runs takes part of it. A
batch is announced to the hosts live at its submit; one that comes later joins the open
batches (work nobody has claimed) before it first waits on the queue, and claims hold
about a second's work, so there is work left for it. Real worker processes; the
assertions are on which host ran what (``ExecResult.worker``), and one generous bound on
how soon a joining host's first result comes."""

from __future__ import annotations

import time
from collections import Counter

import redis

from codepool.common.keys import Keys
from codepool.common.ledger import parse_indices
from codepool.producer import CodePool
from tests.conftest import StartWorker, wait_until

WAIT_S = 100.0  # the test's own bound on collecting a batch
JOINS_WITHIN_S = 5.0  # from a host's process start to its first result (see its test)


def _sleeps(n: int, sleep_s: float) -> list[str]:
    return [f"import time\ntime.sleep({sleep_s})\nprint({i})" for i in range(n)]


def test_a_batch_submitted_while_the_hosts_start_runs_on_every_one(
    redis_url: str, start_worker: StartWorker
) -> None:
    pool = CodePool(redis_url)
    n = 150
    # No host is live yet: the batch is announced once, and no host that starts later is
    # told about it by an announcement.
    batch = pool.submit(_sleeps(n, 0.2), timeout_s=10.0)
    names = [f"cold{i}" for i in range(3)]
    for name in names:
        start_worker(name=name, wait=False)
    results = batch.results(timeout_s=WAIT_S)
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(n)]
    per_host = Counter(r.worker for r in results)
    assert set(per_host) == set(names), per_host
    pool.close()


def test_a_host_started_while_a_batch_runs_takes_part_of_it(
    redis_url: str, start_worker: StartWorker
) -> None:
    for name in ("warm0", "warm1"):
        start_worker(name=name)
    client = redis.Redis.from_url(redis_url)
    wait_until(lambda: client.zcard(Keys().hosts()) == 2, what="two live hosts")
    pool = CodePool(redis_url)
    n = 300
    batch = pool.submit(_sleeps(n, 0.1), timeout_s=10.0)
    iterator = batch.as_completed(timeout_s=WAIT_S)
    seen = [next(iterator)]  # under way on the two warm hosts
    started = time.monotonic()
    late = start_worker(name="late", wait=False)
    joined_after_s = None
    for index, result in iterator:
        if joined_after_s is None and result.worker == "late":
            joined_after_s = time.monotonic() - started
        seen.append((index, result))
    assert sorted(index for index, _ in seen) == list(range(n))
    assert all(r.ok for _, r in seen), [r.stderr for _, r in seen if not r.ok][:3]
    per_host = Counter(r.worker for _, r in seen)
    assert per_host["late"] > 0, (per_host, late.log()[-2000:])
    assert "joining open batch" in late.log()
    # "Takes work within about a second of its dispatchers starting": from the process's
    # start that adds an interpreter, codepool's imports and an executor (a second or
    # two on a loaded two-core machine), so the bound is generous. It is still below
    # what is left of the batch (about 7 s on the warm hosts' four slots), so a host
    # that took a share only late in the batch fails it.
    assert joined_after_s is not None and joined_after_s < JOINS_WITHIN_S, (
        joined_after_s,
        late.log()[-2000:],
    )
    pool.close()
    client.close()


def test_a_lone_host_claims_about_a_second_of_work_at_a_time(
    redis_url: str, start_worker: StartWorker
) -> None:
    """Alone, a host used to claim all of a batch (64 at a time) before any other could
    join; now a claim holds what it can start at once, then what it finishes in about a
    second. Two slots of 0.1 s sleeps finish at most 20 a second, however fast the
    machine: no claim may be larger."""
    start_worker(name="alone", concurrency=2)
    pool = CodePool(redis_url)
    n = 100
    batch = pool.submit(_sleeps(n, 0.1), timeout_s=10.0)
    assert all(r.ok for r in batch.results(timeout_s=WAIT_S))
    client = redis.Redis.from_url(redis_url)
    state = client.hgetall(Keys().batch_state(batch.id))
    claims = {
        int(field[3:]): len(parse_indices(value.decode().rsplit("|", 1)[1]))
        for field, value in state.items()
        if field.startswith(b"c:f")
    }
    sizes = [claims[first] for first in sorted(claims)]
    assert sum(sizes) == n
    assert sizes[0] <= 4, sizes  # what two slots and two dispatchers can start at once
    assert max(sizes) <= 20, sizes
    pool.close()
    client.close()
