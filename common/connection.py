"""Redis clients with explicit timeouts (redis-py 8 defaults to 5 s, too short for
blocking reads and too long to notice a dead server on ordinary ones)."""

from __future__ import annotations

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from codepool.common.settings import Settings


def redis_client(settings: Settings, *, block_s: float = 0.0, retries: int = 3) -> redis.Redis:
    """A client for ``settings.redis_url``; ``block_s`` is the longest blocking command
    this client will issue, added to its socket timeout; ``retries``: how often a
    command that met a dropped connection is tried again (with a short backoff)."""
    tcp = {} if settings.redis_url.startswith("unix:") else {"socket_keepalive": True}
    return redis.Redis.from_url(
        settings.redis_url,
        socket_timeout=settings.socket_timeout_s + block_s,
        socket_connect_timeout=settings.connect_timeout_s,
        health_check_interval=30,
        **tcp,
        retry=Retry(ExponentialBackoff(cap=2.0, base=0.05), retries=retries),
        retry_on_error=[redis.exceptions.ConnectionError],
    )
