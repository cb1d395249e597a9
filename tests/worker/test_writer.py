"""The result writer on a real worker: results streaming in share writes, while a lone
result, the end of a batch and the dispatcher's window never wait for the write gap."""

from __future__ import annotations

import redis

from codepool.producer import CodePool, RemoteSandbox
from tests.conftest import StartWorker

# Longer than any test here may take: a result held for the gap would come back infra.
LONG_GAP_S = 600.0


def _script_pushes(client: redis.Redis) -> int:
    """RPUSH calls so far; each write call with a first write pushes once (scripts'
    commands count in commandstats as calls of their own)."""
    stats = client.info("commandstats").get("cmdstat_rpush", {})
    return int(stats.get("calls", 0))


def test_results_streaming_in_share_writes(redis_url: str, start_worker: StartWorker) -> None:
    start_worker(env={"CODEPOOL_WRITE_GAP_S": "1.0"})
    client = redis.Redis.from_url(redis_url)
    pool = CodePool(redis_url)
    n = 80
    before = _script_pushes(client)
    results = pool.submit([f"print({i})" for i in range(n)]).results(timeout_s=60)
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(n)]
    # One push per result without grouping (plus RQ's own for the announcements).
    pushes = _script_pushes(client) - before
    assert pushes <= n // 4, pushes


def test_lone_results_and_batch_ends_do_not_wait_for_the_gap(
    redis_url: str, start_worker: StartWorker
) -> None:
    start_worker(env={"CODEPOOL_WRITE_GAP_S": str(LONG_GAP_S)})
    # A result nothing would join goes at once, however recent the last write was.
    with RemoteSandbox(redis_url, timeout=5.0, deadline_s=60.0) as sandbox:
        for i in range(3):
            assert sandbox.run_code(f"print({i})").stdout == f"{i}\n"
    # A batch's results are held while others are on their way, but the dispatcher's
    # window does not wait for them (its slots free when the writer takes a result), and
    # its last results go as soon as nothing more is expected: a window tied to the
    # writes, or a tail held for the gap, would leave results infra at the deadline.
    pool = CodePool(redis_url)
    n = 30
    results = pool.submit([f"print({i})" for i in range(n)]).results(timeout_s=60)
    assert [r.status for r in results] == ["ok"] * n, [r.stderr for r in results]
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(n)]
