"""Noticing a Sentinel failover at once, and telling the parts that must act on it.

redis-py's Sentinel pool asks the sentinels for the primary only when it opens a
connection, and a connection to the old primary keeps working after a failover: Sentinel
turns the old primary into a replica only some 8-10 s after it promoted the new one
(measured with Redis 7.0: it waits for the old one to report its role for
4 x its publish period), and until then every write on that connection is acked and then
lost. So a watcher thread per client asks the sentinels once per ``poll_s`` where the
primary is; when it moved, it counts a new *generation*, drops every connection of the
client (in use or not: a command blocked on the old primary fails and is retried on the
new one) and calls what was registered with ``on_new_primary``. Opening a connection
counts a move the same way.

The writes a process made to the old primary just before the move may be missing on the
new one (replication is asynchronous); what depends on them learns of the move here: the
result writer writes its recent results again, a producer stores again a batch the new
primary lacks.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import redis
from redis.sentinel import (
    MasterNotFoundError,
    Sentinel,
    SentinelConnectionPool,
    SentinelManagedConnection,
)

from codepool.common.retry import pause

log = logging.getLogger(__name__)

POLL_S = 1.0
# How long a write follows the primary through an election and the demotion of a
# primary that came back after one (``following``): Sentinel demotes it some 10-11 s
# after it promoted the new one (issue 30).
FOLLOW_S = 15.0
FOLLOW_PAUSE_S = 0.25
# What redis-py's Sentinel connection raises for a READONLY reply on a primary's.
_DEMOTED = "previous master is now a slave"

T = TypeVar("T")


class WatchedSentinel(Sentinel):
    """A Sentinel manager that counts moves of its service's primary (``generation``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
        self.generation = 0
        self._primary: tuple[str, int] | None = None
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []
        self._pool: weakref.ref[SentinelConnectionPool] | None = None
        self._stop = threading.Event()

    def discover_master(self, service_name: str) -> tuple[str, int]:
        found = super().discover_master(service_name)  # type: ignore[no-untyped-call]
        address: tuple[str, int] = (str(found[0]), int(found[1]))
        with self._lock:
            moved = self._primary is not None and address != self._primary
            previous, self._primary = self._primary, address
            if moved:
                self.generation += 1
            callbacks = list(self._callbacks) if moved else []
        if moved:
            log.warning(
                "redis primary of %r moved from %s:%s to %s:%s (failover %d)",
                service_name,
                *(previous or ("?", "?")),
                *address,
                self.generation,
            )
            pool = self._pool() if self._pool is not None else None
            if pool is not None:
                _leave_old_primary(pool)
            for callback in callbacks:
                callback()
        return address

    def on_new_primary(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (quick, any thread) whenever the primary moves."""
        with self._lock:
            self._callbacks.append(callback)

    def watch(self, pool: SentinelConnectionPool, service_name: str, poll_s: float | None) -> None:
        """Ask the sentinels every ``poll_s`` on a daemon thread, while ``pool`` lives
        and its client is not closed; ``None``: never on its own, only when told
        (``recheck``: a worker host's processes follow the host's one watcher, so the
        sentinels hear from a fleet once a second per host, not per process)."""
        self._pool = weakref.ref(pool)
        stop = self._stop
        pool_ref = self._pool
        if poll_s is None:
            return

        def loop() -> None:
            while not stop.wait(poll_s):
                if pool_ref() is None:
                    return
                try:
                    self.discover_master(service_name)
                except redis.RedisError as exc:
                    log.debug("sentinels not answering for %r: %s", service_name, exc)

        threading.Thread(target=loop, name="codepool-sentinel-watch", daemon=True).start()

    def stop_watching(self) -> None:
        """End the thread ``watch`` started (within one poll)."""
        self._stop.set()


def _leave_old_primary(pool: SentinelConnectionPool) -> None:
    """Off the old primary now, not when Sentinel demotes it seconds later: idle
    connections are closed; those in use (a blocked read, a command on its way) are
    shut down under their user, who reads end of stream, a ConnectionError, and retries
    on a new connection (closing the socket itself would leave redis-py a closed file,
    a ValueError no retry covers)."""
    pool.disconnect(inuse_connections=False)
    with pool._lock:
        in_use = list(pool._in_use_connections)
    for connection in in_use:
        sock = getattr(connection, "_sock", None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # closed meanwhile


class SentinelConnection(SentinelManagedConnection):
    """redis-py's connection to a Sentinel-managed primary, with two of its slips put
    right (redis-py 8.1; pyproject bounds the versions):

    - a connection that lost its socket reconnects inside ``send_packed_command`` (the
      client's retry after a dropped connection goes that way) to the address it had,
      without asking Sentinel: a blocking read the failover watcher shut down went back
      to the *old* primary and sat there until Sentinel demoted it, ~10 s later. Here
      it asks Sentinel where the primary is, as a fresh connection does.
    - its ``read_response`` keeps the connection when a read is interrupted (a signal
      handler's exception in a blocking pop, a timeout), where redis-py's plain one
      drops it: the unread reply then answered the next command on it, which waited
      for it (a stopping dispatcher's farewell waited out its BLMOVE, the whole drain
      deadline) or took it for its own. Here an interrupted read drops the connection.
    """

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if not self._sock:
            self.connect()  # type: ignore[no-untyped-call]
        super().send_packed_command(command, check_health)  # type: ignore[no-untyped-call]

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("disconnect_on_error", True)
        return super().read_response(*args, **kwargs)


class SentinelClient(redis.Redis):
    """A client of a Sentinel-managed primary; ``close`` also ends its watcher."""

    def close(self) -> None:
        manager = sentinel_of(self)
        if manager is not None:
            manager.stop_watching()
            manager.close()
        super().close()


def sentinel_of(conn: redis.Redis) -> WatchedSentinel | None:
    """The manager of a Sentinel-managed client; None for a plain one."""
    manager = getattr(conn.connection_pool, "sentinel_manager", None)
    return manager if isinstance(manager, WatchedSentinel) else None


def recheck(conn: redis.Redis) -> None:
    """Ask the sentinels where the primary behind ``conn`` is now (its watcher's round,
    done at once): if it moved, ``conn`` leaves the old one and its callbacks run.
    Nothing without Sentinel; a sentinel that does not answer is the next round's."""
    manager = sentinel_of(conn)
    service = getattr(conn.connection_pool, "service_name", None)
    if manager is None or service is None:
        return
    try:
        manager.discover_master(str(service))
    except redis.RedisError as exc:
        log.debug("sentinels not answering for %r: %s", service, exc)


def follow(conn: redis.Redis, moves: Callable[[], int], period_s: float) -> None:
    """``recheck(conn)`` whenever ``moves()`` (a count another process's watcher keeps:
    a worker host's, on its lease board) changes, looked at every ``period_s`` on a
    daemon thread. Nothing without Sentinel."""
    if sentinel_of(conn) is None:
        return
    conn_ref = weakref.ref(conn)

    def loop() -> None:
        seen = moves()
        while True:
            time.sleep(period_s)
            now = moves()
            if now == seen:
                continue
            seen = now
            followed = conn_ref()
            if followed is None:
                return
            recheck(followed)

    threading.Thread(target=loop, name="codepool-sentinel-follow", daemon=True).start()


def generation(conn: redis.Redis) -> int:
    """How often the primary behind ``conn`` has moved (always 0 without Sentinel)."""
    manager = sentinel_of(conn)
    return 0 if manager is None else manager.generation


def on_new_primary(conn: redis.Redis, callback: Callable[[], None]) -> None:
    """Call ``callback`` whenever the primary behind ``conn`` moves (never without
    Sentinel)."""
    manager = sentinel_of(conn)
    if manager is not None:
        manager.on_new_primary(callback)


def not_the_primary(exc: BaseException) -> bool:
    """Whether ``exc`` says the server written to is not the primary (any more): a
    READONLY reply, redis-py's "The previous master is now a slave" (its Sentinel
    connection's word for READONLY), or no primary named (an election). The write was
    refused, so it can be sent again as it was."""
    if isinstance(exc, (redis.exceptions.ReadOnlyError, MasterNotFoundError)):
        return True
    return isinstance(exc, redis.ConnectionError) and _DEMOTED in str(exc)


def following(conn: redis.Redis, attempt: Callable[[], T], budget_s: float = FOLLOW_S) -> T:
    """``attempt()``; while it fails because the server is not the primary, ask the
    sentinels again where the primary is (``recheck``: ``conn`` leaves the old one) and
    try again, until ``budget_s`` has passed: then the last error is raised. A server
    still loading its dataset after a restart (AOF, RDB) is waited out the same way,
    with or without Sentinel. Any other error is raised at once, and, without Sentinel,
    a server that is not the primary too (docs/chaos.md, findings 6 and the 30-minute
    run's loading Redis)."""
    sentinel = sentinel_of(conn) is not None
    deadline = time.monotonic() + budget_s
    while True:
        try:
            return attempt()
        except redis.exceptions.BusyLoadingError:
            if time.monotonic() >= deadline:
                raise
            pause(deadline, FOLLOW_PAUSE_S)
        except redis.RedisError as exc:
            if not sentinel or not not_the_primary(exc) or time.monotonic() >= deadline:
                raise
            log.warning("redis: not the primary (%s); asking the sentinels again", exc)
            recheck(conn)
            pause(deadline, FOLLOW_PAUSE_S)
