"""Interpreter contexts of the fleet: state that lives across the calls of a
trajectory, on one worker host, reached through Redis (``CodePool.context()``,
``RemoteSandbox.context()``).

A context is opened on a live host that has room (hosts cap their live contexts), and
every call and fork goes to that host's request list; the host answers on a reply list
of the request's own (common/context_requests.py, worker/context_server.py). A fork
lives on its parent's host: it is the host's copy-on-write fork of the parent's state.

The successful calls' code is recorded here, in order (forks inherit it). When the
context's host is lost (its lease lapsed, or no answer within the call's timeout and a
margin), the next call rebuilds the context on another host by replaying that record,
and its result says so (``ExecResult.rebuilt``); with ``rebuild=False`` the call
comes back ``infra``, "the context was lost with its host". Replay re-runs side effects
(prints are dropped, randomness and files are made again): code that must not repeat
belongs in calls that fail, or in a context opened with ``rebuild=False``.

A context nobody closes (a trainer killed mid-step) ends on its host after its idle TTL
(the executor's ``context_ttl_s``), and its Redis record expires after the same time.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

import redis

from codepool.common.codec import decode_result
from codepool.common.context_requests import ContextReply, ContextRequest, new_id
from codepool.common.errors import CodepoolError, RedisUnavailable
from codepool.common.result import ExecResult, not_run, rejected
from codepool.common.retry import retry_until

if TYPE_CHECKING:
    from codepool.producer.pool_view import PoolView

OPEN_TIMEOUT_S = 10.0  # a host that does not answer an open within this is passed over
REPLY_MARGIN_S = 10.0  # beyond a call's own timeout, before its host counts as lost
LIVENESS_EVERY_S = 1.0  # how often a waiting call looks whether its host still lives
DEFAULT_TTL_S = 300.0  # the executors' default context_ttl_s
REQUESTS_TTL_S = 3600  # a dead host's request list expires
RECORD_MARGIN_S = 5  # the Redis record outlives the host's idle TTL by this much
REBUILD_ATTEMPTS = 3  # rebuilds of one call's context, each after a fault
REOPEN_PAUSE_S = 1.0  # between tries to open a lost context anew while no host can
# What a Redis that restarts, loads its AOF or fails over looks like: ridden out.
OUTAGE_ERRORS = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)
OUTAGE_PAUSE_S = 0.5

KILLED = "killed by its caller"  # RemoteContext.ended after kill()

T = TypeVar("T")


class ContextLost(CodepoolError):
    """The context's host is gone and it could not be rebuilt."""


class RemoteContext:
    """One interpreter context of the fleet; thread-safe, calls run in order."""

    def __init__(
        self,
        pool: PoolView,
        context_id: str,
        host: str,
        limits: dict[str, Any],
        *,
        rebuild: bool = True,
        ttl_s: float = DEFAULT_TTL_S,
        history: list[str] | None = None,
    ) -> None:
        self.pool = pool
        self.id = context_id
        self.host = host
        self.limits = limits
        self.rebuild = rebuild
        self.ttl_s = ttl_s
        self.history: list[str] = list(history or [])
        self.rebuilds = 0
        self.ended: str | None = None
        self._lock = threading.RLock()

    # -- calls -----------------------------------------------------------------------

    def run_code(self, code: str, **limits: Any) -> ExecResult:
        """Run ``code`` in this context; the ExecResult of this call alone (``infra``
        when Redis stayed unreachable past the call's timeout and a margin: the context
        lives on)."""
        try:
            return self._run_code(code, **limits)
        except RedisUnavailable as exc:
            return not_run("infra", f"codepool: {exc}")

    def _run_code(self, code: str, **limits: Any) -> ExecResult:
        with self._lock:
            if self.ended is not None:
                return rejected(f"rejected: the context ended: {self.ended}")
            timeout_s = float(limits.get("timeout_s", self.limits.get("timeout_s", 30.0)))
            reply = self._ask(ContextRequest("run", self.id, code=code, limits=limits), timeout_s)
            rebuilt = False
            for _ in range(REBUILD_ATTEMPTS):
                if reply is not None and not reply.lost:
                    break
                lost = self._lost(timeout_s)
                if lost is not None:
                    return lost
                rebuilt = True
                reply = self._ask(
                    ContextRequest("run", self.id, code=code, limits=limits), timeout_s
                )
            if reply is None or reply.lost:
                self.ended = f"its host {self.host} was lost right after each of its rebuilds"
                return not_run("infra", f"codepool: {self.ended}")
            if not reply.ok:
                self.ended = reply.error
                return rejected(f"rejected: the context ended: {reply.error}")
            result = decode_result(reply.result)
            if result.status == "ok":
                self.history.append(code)
            elif result.status in ("timeout", "memory") or result.limit == "cpu_time":
                self.ended = f"its call ended it ({result.status})"
            return result.replace(rebuilt=True) if rebuilt else result

    async def arun_code(self, code: str, **limits: Any) -> ExecResult:
        return await asyncio.to_thread(self.run_code, code, **limits)

    def fork(self, n: int = 1) -> list[RemoteContext]:
        """n new contexts on this one's host, each from a copy of its state now."""
        with self._lock:
            if self.ended is not None:
                raise CodepoolError(f"cannot fork: the context ended: {self.ended}")
            new = [new_id() for _ in range(n)]
            reply = self._ask(ContextRequest("fork", self.id, new=new), OPEN_TIMEOUT_S)
            if reply is None or reply.lost:
                if self._lost(OPEN_TIMEOUT_S) is not None:
                    raise ContextLost(f"cannot fork: {self.ended}")
                reply = self._ask(ContextRequest("fork", self.id, new=new), OPEN_TIMEOUT_S)
            if reply is None or not reply.ok:
                raise CodepoolError(f"cannot fork: {reply.error if reply else 'host lost'}")
            forks = [
                RemoteContext(
                    self.pool,
                    fork_id,
                    self.host,
                    self.limits,
                    rebuild=self.rebuild,
                    ttl_s=self.ttl_s,
                    history=self.history,
                )
                for fork_id in new
            ]
            for fork in forks:
                fork._record()
            return forks

    async def afork(self, n: int = 1) -> list[RemoteContext]:
        return await asyncio.to_thread(self.fork, n)

    def close(self) -> None:
        """End the context (idempotent; its host and Redis record let it go)."""
        with self._lock:
            if self.ended == "closed by its caller":
                return
            was_live = self.ended is None
            self.ended = "closed by its caller"
        if was_live:
            self._send_close()

    def kill(self) -> None:
        """End the context now, without waiting for a call it runs (as ``close`` does):
        its host ends that call with it, and the call comes back as ended. Idempotent."""
        was_live = self.ended is None
        self.ended = KILLED
        if was_live:
            self._send_close()

    def _send_close(self) -> None:
        keys = self.pool.keys
        try:
            requests_key = keys.host_requests(self.host)
            with self.pool.conn.pipeline(transaction=False) as pipe:
                pipe.rpush(requests_key, ContextRequest("close", self.id).encode())
                # A list its host drained is made anew by this push: a dead host's expires.
                pipe.expire(requests_key, REQUESTS_TTL_S)
                pipe.delete(keys.context(self.id))
                pipe.execute()
        except redis.RedisError:
            pass  # its host's TTL ends it

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    def __enter__(self) -> RemoteContext:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> RemoteContext:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- the way there -----------------------------------------------------------------

    def _record(self) -> None:
        keys = self.pool.keys
        with self.pool.conn.pipeline(transaction=False) as pipe:
            pipe.hset(keys.context(self.id), mapping={"host": self.host, "ttl": self.ttl_s})
            pipe.expire(keys.context(self.id), int(self.ttl_s) + RECORD_MARGIN_S)
            pipe.execute()

    def _ask(self, request: ContextRequest, timeout_s: float) -> ContextReply | None:
        """Send ``request`` to the host and wait for its reply; None when the host
        lapsed meanwhile or did not answer within ``timeout_s`` and a margin. A Redis
        that restarts or fails over meanwhile is ridden out, as a batch's collection
        does; RedisUnavailable if it is still gone at that deadline."""
        keys, conn = self.pool.keys, self.pool.conn
        requests_key = keys.host_requests(self.host)
        deadline = time.monotonic() + timeout_s + REPLY_MARGIN_S

        def push() -> None:
            with conn.pipeline(transaction=False) as pipe:
                pipe.rpush(requests_key, request.encode())
                pipe.expire(requests_key, REQUESTS_TTL_S)
                pipe.expire(keys.context(self.id), int(self.ttl_s) + RECORD_MARGIN_S)
                pipe.execute()

        # The host drops a request id it has seen (worker/context_server.py), so a push
        # whose reply was lost may be sent again.
        self._riding_out(deadline, push)
        reply_key = keys.context_reply(request.id)
        while True:
            wait_s = min(LIVENESS_EVERY_S, deadline - time.monotonic())
            if wait_s <= 0:
                return None

            def wait(wait_s: float = wait_s) -> tuple[Any, bool]:
                popped = conn.blpop([reply_key], timeout=max(0.01, wait_s))
                return popped, popped is not None or host_lives(self.pool, self.host)

            popped, lives = self._riding_out(deadline, wait)
            if popped is not None:
                return ContextReply.decode(cast(list[bytes], popped)[1])
            if not lives:
                return None

    def _riding_out(self, deadline: float, attempt: Callable[[], T]) -> T:
        """``attempt`` until it gets through to Redis, until ``deadline``."""
        try:
            return retry_until(deadline, attempt, errors=OUTAGE_ERRORS, pause_s=OUTAGE_PAUSE_S)
        except OUTAGE_ERRORS as exc:
            raise RedisUnavailable(f"context {self.id}: Redis unreachable: {exc}") from exc

    def _lost(self, timeout_s: float) -> ExecResult | None:
        """The context's state is lost (its host is gone or restarted, its supervisor
        died): rebuild it (None: rebuilt) or say why it cannot be. The old context is
        closed first, in case its host lives on; a rebuild that meets a fault (a host
        lost or restarted during the replay) is tried again, REBUILD_ATTEMPTS in all, and
        while no host can take it (none live, or each restarting its supervisor) it
        keeps asking, until the call's timeout and a margin have passed."""
        lost_host = self.host
        if not self.rebuild:
            self.ended = f"the context was lost with its host {lost_host}"
            return not_run("infra", f"codepool: {self.ended}")
        give_up = time.monotonic() + timeout_s + REPLY_MARGIN_S
        for _ in range(REBUILD_ATTEMPTS):
            self._send_close()  # its host's requests run in order: before the reopen
            while True:
                try:
                    self.host, self.ttl_s = self._reopen(lost_host)
                    break
                except CodepoolError as exc:
                    if time.monotonic() >= give_up:
                        self.ended = (
                            f"its host {lost_host} was lost and no host could take it: {exc}"
                        )
                        return not_run("infra", f"codepool: {self.ended}")
                    time.sleep(REOPEN_PAUSE_S)
            self._record()
            replayed = self._replay(timeout_s)
            if replayed is None:
                continue  # a fault during the replay: again, from the start
            if not replayed:
                self.ended = f"its host {lost_host} was lost and replaying its calls failed"
                return not_run("infra", f"codepool: {self.ended}")
            break
        else:
            self.ended = f"its host {lost_host} was lost and each rebuild met a fault"
            return not_run("infra", f"codepool: {self.ended}")
        self.rebuilds += 1
        try:
            self.pool.conn.hincrby(self.pool.keys.stats(), "contexts_rebuilt", 1)
        except redis.RedisError:
            pass  # a count, not the call
        return None

    def _reopen(self, lost_host: str) -> tuple[str, float]:
        """Open the context anew: on another host if one can take it, else on the same
        one if it lives (restarted under its name, or with a new supervisor)."""
        try:
            return open_on_a_host(self.pool, self.id, self.limits, exclude={lost_host})
        except CodepoolError:
            if not host_lives(self.pool, lost_host):
                raise
            return open_on_a_host(self.pool, self.id, self.limits, exclude=set())

    def _replay(self, timeout_s: float) -> bool | None:
        """Run the recorded calls again: True when each came back ok, False when one
        did not (it will not on any host), None when a fault cut the replay short."""
        for code in self.history:
            reply = self._ask(ContextRequest("run", self.id, code=code), timeout_s)
            if reply is None or reply.lost:
                return None
            if not reply.ok or decode_result(reply.result).status != "ok":
                return False
        return True


def host_lives(pool: PoolView, host: str) -> bool:
    """Whether worker host ``host`` holds a lease (Redis server time): its latest,
    ``host~{token}`` (``.N`` once fenced and back: a host that lost its lease and took
    one anew still serves its contexts under its own name)."""
    with pool.conn.pipeline(transaction=False) as pipe:
        pipe.time()
        pipe.get(pool.keys.host_start(host))
        (seconds, micros), lease = pipe.execute()
    score = pool.conn.zscore(pool.keys.hosts(), lease) if lease else None
    return score is not None and float(score) >= seconds + micros / 1e6 - pool.settings.lease_s


def live_hosts(pool: PoolView) -> list[str]:
    seconds, micros = pool.conn.time()
    since = seconds + micros / 1e6 - pool.settings.lease_s
    names = cast(list[bytes], pool.conn.zrangebyscore(pool.keys.hosts(), since, "+inf"))
    # A host that was fenced and came back holds its lease as host~N; it serves its
    # contexts under its own name.
    return sorted({name.decode().split("~")[0] for name in names})


def open_on_a_host(
    pool: PoolView, context_id: str, limits: dict[str, Any], *, exclude: set[str]
) -> tuple[str, float]:
    """Open context ``context_id`` on a live host (a random one with room); its name and
    its idle TTL."""
    hosts = [host for host in live_hosts(pool) if host not in exclude]
    random.shuffle(hosts)
    errors = []
    for host in hosts:
        probe = RemoteContext(pool, context_id, host, limits)
        reply = probe._ask(ContextRequest("open", context_id, limits=limits), OPEN_TIMEOUT_S)
        if reply is not None and reply.ok:
            return host, reply.ttl_s or DEFAULT_TTL_S
        errors.append(f"{host}: {reply.error if reply else 'no answer'}")
    if not hosts:
        raise CodepoolError("no live worker host to open a context on")
    raise CodepoolError("no worker host could open a context: " + "; ".join(errors))


def open_context(pool: PoolView, limits: dict[str, Any], *, rebuild: bool = True) -> RemoteContext:
    context_id = new_id()
    host, ttl_s = open_on_a_host(pool, context_id, limits, exclude=set())
    context = RemoteContext(pool, context_id, host, limits, rebuild=rebuild, ttl_s=ttl_s)
    context._record()
    return context
