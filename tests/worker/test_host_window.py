"""The host's slots shared by its dispatchers: each keeps its share and may borrow what
its siblings leave free, so the one dispatcher that joins a batch can use the whole
host; on a real worker a batch is one RQ job per host and runs on all its slots."""

from __future__ import annotations

import statistics
from pathlib import Path

import redis
from rq.registry import FinishedJobRegistry

from codepool.common.codec import MsgpackSerializer
from codepool.producer import CodePool
from codepool.worker import host_window
from codepool.worker.host_window import HostWindow
from tests.conftest import StartWorker, wait_until


def test_a_dispatcher_keeps_its_share_and_borrows_what_siblings_leave(tmp_path: Path) -> None:
    path = str(tmp_path / "window")
    host_window.create(path, 4)
    # 8 slots, 4 dispatchers: a share of 3 each, 12 in the executor at most.
    windows = [HostWindow(path, slot=i, slots=8, dispatchers=4) for i in range(4)]
    alone = windows[0]
    assert (alone.share, alone.capacity) == (3, 12)
    assert alone.room(0) == 12  # alone on the host: all of it
    alone.publish(12)
    assert alone.room(12) == 0
    # A sibling that joins another batch still gets its share at once.
    assert windows[1].room(0) == 3
    windows[1].publish(3)
    # Over capacity now: the borrower starts nothing until it is back within its share
    # plus what is free; the sibling keeps its share.
    assert alone.room(12) < 0 and windows[1].room(3) == 0
    alone.publish(2)
    assert alone.room(2) == 7 and windows[1].room(3) == 7
    # The host zeroes a dead dispatcher's cell before starting another in its place.
    host_window.clear(path, 0)
    assert windows[1].room(3) == 9
    for window in windows:
        window.close()


def test_a_batch_is_one_job_per_host_and_uses_every_slot(
    redis_url: str, start_worker: StartWorker
) -> None:
    # 4 slots and 4 dispatchers: a share is 2, so only borrowing runs 4 at once.
    start_worker(concurrency=4)
    pool = CodePool(redis_url)
    client = redis.Redis.from_url(redis_url)
    finished = FinishedJobRegistry("codepool", connection=client, serializer=MsgpackSerializer)
    # Warm-up: the live host count the next submit announces to comes from this one.
    assert all(r.ok for r in pool.submit(["print(0)"]).results(timeout_s=60))
    sleep_s = 3.0
    code = f"import time\nprint(time.time())\ntime.sleep({sleep_s})"
    batch = pool.submit([code] * 4)
    results = batch.results(timeout_s=60)
    assert all(r.ok for r in results), [r.stderr for r in results]
    starts = [float(r.stdout) for r in results]
    # In pairs the second pair would start a whole sleep after the first.
    assert max(starts) - min(starts) < sleep_s * 2 / 3, starts
    assert statistics.median(r.queue_s for r in results) < sleep_s / 2
    wait_until(lambda: any(j.startswith(batch.id) for j in finished.get_job_ids()))
    assert len([j for j in finished.get_job_ids() if j.startswith(batch.id)]) == 1
    client.close()
