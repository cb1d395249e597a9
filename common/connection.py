"""Redis clients with explicit timeouts (redis-py 8 defaults to 5 s, too short for
blocking reads and too long to notice a dead server on ordinary ones). Every client of
the product is made here, for a plain URL or a Sentinel-managed primary
(``redis+sentinel://``, common/redis_url.py)."""

from __future__ import annotations

from typing import Any, cast

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry
from redis.sentinel import SentinelConnectionPool

from codepool.common.errors import ConfigError
from codepool.common.failover import POLL_S, SentinelClient, WatchedSentinel
from codepool.common.redis_url import is_sentinel_url, parse_sentinel_url, redact
from codepool.common.settings import Settings

# The backoff between retries of a command that met a dropped connection.
BACKOFF_BASE_S = 0.05
BACKOFF_CAP_S = 2.0


def redis_client(
    settings: Settings, *, block_s: float = 0.0, retries: int = 3, decode_responses: bool = False
) -> redis.Redis:
    """A client for ``settings.redis_url``; ``block_s`` is the longest blocking command
    this client will issue, added to its socket timeout; ``retries``: how often a
    command that met a dropped connection is tried again (with a short backoff), the
    same with Sentinel: a failover is ridden out by the callers' own loops, as a Redis
    restart is. (A budget long enough to cover an election would hide the outage from
    the janitors, who trust lapsed leases only after a whole lease of answered round
    trips: they would cancel a producer whose beats the outage held up.)"""
    url = settings.redis_url
    options: dict[str, Any] = {
        "socket_timeout": settings.socket_timeout_s + block_s,
        "socket_connect_timeout": settings.connect_timeout_s,
        "health_check_interval": 30,
        "retry_on_error": [redis.exceptions.ConnectionError],
        "decode_responses": decode_responses,
    }
    if not url.startswith("unix:"):
        options["socket_keepalive"] = True
    options["retry"] = Retry(
        ExponentialBackoff(cap=BACKOFF_CAP_S, base=BACKOFF_BASE_S), retries=retries
    )
    if is_sentinel_url(url):
        return _sentinel_client(settings, options)
    try:
        return redis.Redis.from_url(url, **options)
    except ValueError as exc:
        raise ConfigError(f"bad Redis URL {redact(url)}: {exc}") from None


def _sentinel_client(settings: Settings, options: dict[str, Any]) -> redis.Redis:
    address = parse_sentinel_url(settings.redis_url)
    # Finding the primary asks each sentinel in turn: all of them together within the
    # connect timeout, so a client with short timeouts (a stopping worker) stays quick.
    per_sentinel_s = max(0.2, settings.connect_timeout_s / len(address.sentinels))
    sentinel_options: dict[str, Any] = {
        "socket_timeout": per_sentinel_s,
        "socket_connect_timeout": per_sentinel_s,
    }
    if address.sentinel_password is not None:
        sentinel_options["password"] = address.sentinel_password
        sentinel_options["username"] = address.sentinel_username
    manager = WatchedSentinel(list(address.sentinels), sentinel_kwargs=sentinel_options)
    client: redis.Redis = manager.master_for(  # type: ignore[no-untyped-call]
        address.service,
        redis_class=SentinelClient,
        db=address.db,
        username=address.username,
        password=address.password,
        **options,
    )
    manager.watch(cast(SentinelConnectionPool, client.connection_pool), address.service, POLL_S)
    return client
