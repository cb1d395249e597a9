"""Redis clients with explicit timeouts (redis-py 8 defaults to 5 s, too short for
blocking reads and too long to notice a dead server on ordinary ones). Every client of
the product is made here, for a plain URL or a Sentinel-managed primary
(``redis+sentinel://``, common/redis_url.py)."""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from typing import Any, TypeVar, cast

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry
from redis.sentinel import SentinelConnectionPool

from codepool.common.errors import ConfigError
from codepool.common.failover import (
    POLL_S,
    SentinelClient,
    SentinelConnection,
    WatchedSentinel,
)
from codepool.common.redis_url import is_sentinel_url, parse_sentinel_url, redact
from codepool.common.settings import Settings

# The backoff between retries of a command that met a dropped connection.
BACKOFF_BASE_S = 0.05
BACKOFF_CAP_S = 2.0

T = TypeVar("T")


class _Tally:
    """A count shared by every copy of one CountingRetry."""

    def __init__(self) -> None:
        self.count = 0
        self.lock = threading.Lock()


class CountingRetry(Retry):
    """redis-py's Retry that also counts the failures it retried or gave up on, for all
    of one client's connections together (each connection gets a deep copy of its
    client's Retry; the copies share one tally). A failure redis-py retried is silent:
    a blocking pop whose reply a dropped connection lost is simply sent again, and what
    it popped is gone. A reader that must not lose such a reply compares
    ``connection_failures`` before and after its read."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._tally = _Tally()

    def __deepcopy__(self, memo: dict[int, Any]) -> CountingRetry:
        twin = copy.copy(self)
        twin._backoff = copy.deepcopy(self._backoff, memo)
        twin._supported_errors = tuple(self._supported_errors)
        return twin  # the same _tally

    def call_with_retry(
        self,
        do: Callable[[], T],
        fail: Callable[..., Any],
        is_retryable: Callable[[Exception], bool] | None = None,
        with_failure_count: bool = False,
    ) -> T:
        def counted(error: Exception, *more: Any) -> Any:
            with self._tally.lock:
                self._tally.count += 1
            return fail(error, *more)

        return super().call_with_retry(do, counted, is_retryable, with_failure_count)

    @property
    def failures(self) -> int:
        return self._tally.count


def connection_failures(conn: redis.Redis) -> int:
    """How many commands of ``conn``'s met a connection error so far (retried or not);
    0 for a client not made by ``redis_client``."""
    retry = conn.get_connection_kwargs().get("retry")
    return retry.failures if isinstance(retry, CountingRetry) else 0


def redis_client(
    settings: Settings,
    *,
    block_s: float = 0.0,
    retries: int = 3,
    decode_responses: bool = False,
    watch_s: float | None = POLL_S,
) -> redis.Redis:
    """A client for ``settings.redis_url``; ``block_s`` is the longest blocking command
    this client will issue, added to its socket timeout; ``retries``: how often a
    command that met a dropped connection is tried again (with a short backoff), the
    same with Sentinel: a failover is ridden out by the callers' own loops, as a Redis
    restart is. (A budget long enough to cover an election would hide the outage from
    the janitors, who trust lapsed leases only after a whole lease of answered round
    trips: they would cancel a producer whose beats the outage held up.) ``watch_s``:
    how often a Sentinel client asks where the primary is (common/failover.py);
    ``None``: only when told (``failover.recheck``), for the processes of a worker host,
    which follow the host's own client."""
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
    options["retry"] = CountingRetry(
        ExponentialBackoff(cap=BACKOFF_CAP_S, base=BACKOFF_BASE_S), retries=retries
    )
    if is_sentinel_url(url):
        return _sentinel_client(settings, options, watch_s)
    try:
        return redis.Redis.from_url(url, **options)
    except ValueError as exc:
        raise ConfigError(f"bad Redis URL {redact(url)}: {exc}") from None


def _sentinel_client(
    settings: Settings, options: dict[str, Any], watch_s: float | None
) -> redis.Redis:
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
        connection_class=SentinelConnection,
        db=address.db,
        username=address.username,
        password=address.password,
        **options,
    )
    manager.watch(cast(SentinelConnectionPool, client.connection_pool), address.service, watch_s)
    return client
