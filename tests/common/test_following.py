"""failover.following on a plain URL (common/failover.py): a Redis still loading its
dataset after a restart is waited out within the budget (the 30-minute chaos run: submits
and lone calls came back infra with "Redis is loading the dataset in memory"); a server
that is not the primary is said at once, as there are no sentinels to ask."""

from __future__ import annotations

import pytest
import redis

from codepool.common import failover


def test_a_loading_redis_is_waited_out(redis_url: str) -> None:
    conn = redis.Redis.from_url(redis_url)
    tries: list[int] = []

    def attempt() -> str:
        tries.append(1)
        if len(tries) < 3:
            raise redis.exceptions.BusyLoadingError("Redis is loading the dataset in memory")
        return str(conn.ping())

    assert failover.following(conn, attempt, budget_s=5.0) == "True"
    assert len(tries) == 3
    conn.close()


def test_a_redis_loading_past_the_budget_is_said(redis_url: str) -> None:
    conn = redis.Redis.from_url(redis_url)

    def attempt() -> None:
        raise redis.exceptions.BusyLoadingError("Redis is loading the dataset in memory")

    with pytest.raises(redis.exceptions.BusyLoadingError):
        failover.following(conn, attempt, budget_s=0.5)
    conn.close()


def test_a_replica_on_a_plain_url_is_said_at_once(redis_url: str) -> None:
    conn = redis.Redis.from_url(redis_url)
    tries: list[int] = []

    def attempt() -> None:
        tries.append(1)
        raise redis.exceptions.ReadOnlyError("You can't write against a read only replica.")

    with pytest.raises(redis.exceptions.ReadOnlyError):
        failover.following(conn, attempt, budget_s=5.0)
    assert tries == [1]
    conn.close()
