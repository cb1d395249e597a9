"""RemoteSandbox: drop-in for the reference ``LocalPythonSandbox``, backed by the pool.

A call that finds few others waiting (at most ``LONE_UP_TO``: an agent's tool call
among independent agents) goes out at once, without linger, as a lone call on the
fleet's open work channels (producer/calls.py): no RQ job, a few Redis commands. A
burst (a rollout's ``asyncio.gather(*(sb.arun_code(c) for c in codes))``) is coalesced:
it waits ``linger_s`` for company, then up to ``max_batch`` calls go out as one batch,
which every live host shares. With no live host, every call goes as a batch (which
waits for hosts to come). Calls resolve concurrent futures from background threads, so
the same sandbox works under a new ``asyncio.run`` per step, and from plain threads.

A call its caller gives up on (``arun_code`` cancelled, directly or by ``wait_for``; a
cancelled ``submit`` future) is cancelled in its batch, and only there: its batch mates
run and resolve as if it had never been (common/cancellation.py). Closing the sandbox
gives up on every call in flight; they resolve with status ``cancelled``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import queue
import threading
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import redis

from codepool.common.cancellation import CLOSED_MESSAGE
from codepool.common.errors import CodepoolError
from codepool.common.limits import Limits
from codepool.common.observation import DEFAULT_MARKERS, format_tool_content
from codepool.common.result import CANCELLED, ExecResult, cancelled, infra
from codepool.common.reward_tests import DEFAULT_TIMEOUT_S, Case, CaseResult, arun_tests, run_tests
from codepool.common.sandbox_stats import SandboxStats
from codepool.common.settings import Settings
from codepool.common.snippet import split_inputs
from codepool.producer.context import RemoteContext
from codepool.producer.pool import Batch, CodePool, _limits_with

log = logging.getLogger(__name__)

# Calls found waiting together up to this many go out as lone calls, more as a batch.
LONE_UP_TO = 16


@dataclass(eq=False)
class _Call:
    """A call: its snippet, its future, when it was made, and its Limits overrides
    (calls with the same overrides share batches); once submitted, its batch and index
    there; and whether its caller gave up on it."""

    snippet: Any
    future: Future[ExecResult]
    started: float
    overrides: tuple[tuple[str, Any], ...]
    batch: Batch | None = None
    index: int = -1
    given_up: bool = False
    lone: Future[ExecResult] | None = None  # sent as a lone call: its channel future


class RemoteSandbox:
    """The reference sandbox API (``run_code``, ``arun_code``, ``format_tool_content``,
    ``stats.metrics()``) over a remote codepool.

    url: Redis URL (default ``$REDIS_URL``). timeout: seconds per snippet.
    run: run tag for the pool's per-run stats. linger_s / max_batch: coalescing.
    lone: send calls that come alone as lone calls (False: every call in a batch).
    deadline_s: a backstop per batch: what has no result by then is infra (default:
        timeout plus a margin for queueing; lost workers are recovered through their
        leases long before). Other keywords: Limits fields.
    """

    def __init__(
        self,
        url: str | None = None,
        timeout: float = 30.0,
        *,
        run: str = "",
        linger_s: float = 0.001,
        max_batch: int = 1024,
        deadline_s: float | None = None,
        max_collectors: int = 64,
        lone: bool = True,
        markers: Mapping[str, str] = DEFAULT_MARKERS,
        settings: Settings | None = None,
        **limits: Any,
    ) -> None:
        self.timeout = timeout
        self.run = run
        self.linger_s = linger_s
        self.max_batch = max_batch
        self.lone = lone
        self.deadline_s = deadline_s  # None: each batch's timeout plus 300 s
        self.markers = markers
        self.limits = dict(limits, timeout_s=timeout)
        self.pool = CodePool(url, settings=settings)
        self.stats = SandboxStats()
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._collectors = ThreadPoolExecutor(max_collectors, thread_name_prefix="codepool-collect")
        self._closed = False
        self._count_lock = threading.Lock()
        self._in_flight = 0  # calls submitted in batches and not yet resolved
        self._given_up: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._canceller: threading.Thread | None = None
        self._batcher = threading.Thread(
            target=self._coalesce, name="codepool-coalesce", daemon=True
        )
        self._batcher.start()

    def submit(self, code: Any, **keywords: Any) -> Future[ExecResult]:
        """Queue one snippet for the next batch; the future resolves to its result.
        Keywords: the snippet's inputs (``stdin=``, ``files=``, ``fetch_files=``,
        ``cells=``, ``cell_timeout_s=``) and Limits fields for this call only (calls
        with the same ones share batches). ConfigError for bad keywords."""
        if self._closed:
            raise CodepoolError("RemoteSandbox is closed")
        call = self._call(code, keywords)
        call.future.add_done_callback(functools.partial(self._on_done, call))
        self._calls.put(call)
        return call.future

    def _call(self, code: Any, keywords: dict[str, Any]) -> _Call:
        snippet, overrides = split_inputs(code, keywords)
        if overrides:
            self.pool.limits.with_overrides(**{**self.limits, **overrides})  # checked now
        return _Call(snippet, Future(), time.monotonic(), tuple(sorted(overrides.items())))

    def _on_done(self, call: _Call, future: Future[ExecResult]) -> None:
        # On the thread that cancelled the future (an event loop's, for arun_code):
        # nothing here may wait on Redis.
        if not future.cancelled():
            return
        with self._count_lock:
            call.given_up = True
            submitted = call.batch is not None
            lone = call.lone
        if lone is not None:  # the channel withdraws or cancels it
            lone.cancel()
        elif submitted:  # else it is left out of its batch (_dispatch) or cancelled there
            self._give_up(call)

    def _give_up(self, call: _Call) -> None:
        """Cancel ``call`` in its batch, on the canceller thread."""
        with self._count_lock:
            if self._canceller is None:
                self._canceller = threading.Thread(
                    target=self._cancel_given_up, name="codepool-cancel", daemon=True
                )
                self._canceller.start()
        self._given_up.put(call)

    def _cancel_given_up(self) -> None:
        while True:
            first = self._given_up.get()
            calls = [first]
            while True:  # what gathered meanwhile goes in one call per batch
                try:
                    calls.append(self._given_up.get_nowait())
                except queue.Empty:
                    break
            by_batch: defaultdict[Batch, list[int]] = defaultdict(list)
            for call in calls:
                if call is not None and call.batch is not None:
                    by_batch[call.batch].append(call.index)
            for batch, indices in by_batch.items():
                try:
                    batch.cancel(indices)
                except CodepoolError as exc:
                    log.warning(
                        "batch %s: could not cancel %d calls: %s", batch.id, len(indices), exc
                    )
            if None in calls:
                return

    def run_code(self, code: Any, **keywords: Any) -> ExecResult:
        """Run one snippet and wait for its result. Keywords: as ``submit``'s."""
        with self._count_lock:
            # An idle sandbox runs a lone blocking call on the caller's own thread:
            # two thread hand-offs less. Anything concurrent goes through the batcher.
            direct = self._in_flight == 0 and self._calls.empty() and not self._closed
            if direct:
                self._in_flight += 1
        if not direct:
            return self.submit(code, **keywords).result()
        try:
            call = self._call(code, keywords)
        except CodepoolError:
            with self._count_lock:
                self._in_flight -= 1
            raise
        if self.lone and self.pool.watch():  # on this thread: push and wait in one trip
            try:
                result = self.pool.calls.run(
                    call.snippet, self._limits_of(call), run=self.run, deadline_s=self.deadline_s
                )
            except redis.RedisError as exc:
                result = infra(f"codepool: {exc}")
            self._resolve(call, result)
        else:
            self._submit_batch([call])
        return call.future.result()

    async def arun_code(self, code: Any, **keywords: Any) -> ExecResult:
        """``run_code`` for async callers (any event loop)."""
        # wrap_future binds to whichever loop awaits, so asyncio.run per step works.
        return await asyncio.wrap_future(self.submit(code, **keywords))

    def run_tests(
        self,
        candidate: str,
        cases: Sequence[Case],
        *,
        prefix: str = "",
        timeout_s: float = DEFAULT_TIMEOUT_S,
        **limits: Any,
    ) -> list[CaseResult]:
        """Run ``candidate`` against ``cases``: loaded once, each case in a fork of it,
        with the verdicts one ``run_code`` per case would get (common/reward_tests.py).
        timeout_s: wall clock per case, seconds. Other keywords: Limits fields."""
        return run_tests(
            self.run_code, candidate, cases, prefix=prefix, timeout_s=timeout_s, **limits
        )

    async def arun_tests(
        self,
        candidate: str,
        cases: Sequence[Case],
        *,
        prefix: str = "",
        timeout_s: float = DEFAULT_TIMEOUT_S,
        **limits: Any,
    ) -> list[CaseResult]:
        """``run_tests`` for async callers (concurrent calls share batches)."""
        return await arun_tests(
            self.arun_code, candidate, cases, prefix=prefix, timeout_s=timeout_s, **limits
        )

    def context(self, *, rebuild: bool = True, **limits: Any) -> RemoteContext:
        """An interpreter context on the fleet (``CodePool.context``), with this
        sandbox's limits as its defaults."""
        return self.pool.context(rebuild=rebuild, **{**self.limits, **limits})

    async def acontext(self, *, rebuild: bool = True, **limits: Any) -> RemoteContext:
        return await self.pool.acontext(rebuild=rebuild, **{**self.limits, **limits})

    def format_tool_content(self, result: ExecResult) -> str:
        return format_tool_content(result, timeout_s=self.timeout, markers=self.markers)

    def close(self, *, wait: bool = False) -> None:
        """Stop taking calls and disconnect. The calls in flight are given up on (they
        resolve with status ``cancelled``: what has not started never starts, what runs
        is killed), or, with ``wait``, have their results first."""
        if self._closed:
            return
        self._closed = True
        self._calls.put(None)
        self._batcher.join(timeout=10)
        if wait:
            self._collectors.shutdown(wait=True)
            while self._in_flight > 0:  # lone calls: their results first
                time.sleep(0.01)
        while True:  # calls that came with the close, after the batcher's last look
            try:
                call = self._calls.get_nowait()
            except queue.Empty:
                break
            if call is not None:
                with self._count_lock:
                    self._in_flight += 1
                self._resolve(call, cancelled(CLOSED_MESSAGE))
        # Gives up every batch still in flight, within a bounded wait on Redis, and ends
        # the collections going on: their calls resolve cancelled.
        self.pool.close()
        self._given_up.put(None)
        if self._canceller is not None:
            self._canceller.join(timeout=1)
        self._collectors.shutdown(wait=True)

    def __enter__(self) -> RemoteSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _coalesce(self) -> None:
        while True:
            first = self._calls.get()
            if first is None:
                return
            calls = [first]
            # What waits now, without linger: few calls go out at once as lone calls.
            stop = self._gather_more(calls, linger=False)
            if len(calls) <= LONE_UP_TO and self._dispatch_lone(calls):
                if stop:
                    return
                continue
            # A burst (or no live host): linger for company only when calls are
            # already in flight (a rollout's burst), then batches.
            if not stop:
                stop = self._gather_more(calls, linger=self._in_flight > 0)
            self._dispatch(calls)
            if stop:
                return

    def _gather_more(self, calls: list[_Call], *, linger: bool) -> bool:
        """Add calls arriving within the linger to ``calls``; True if close was asked."""
        deadline = time.monotonic() + (self.linger_s if linger else 0.0)
        while len(calls) < self.max_batch:
            remaining = deadline - time.monotonic()
            try:
                call = (
                    self._calls.get(timeout=remaining)
                    if remaining > 0
                    else self._calls.get_nowait()
                )
            except queue.Empty:
                return False
            if call is None:
                return True
            calls.append(call)
        return False

    def _dispatch_lone(self, calls: list[_Call]) -> bool:
        """Send ``calls`` as lone calls if a host lives; False (nothing sent) if not."""
        with self._count_lock:
            calls = [call for call in calls if not call.given_up]
            self._in_flight += len(calls)
        if not calls or self._send_lone(calls):
            return True
        with self._count_lock:
            self._in_flight -= len(calls)
        return False

    def _send_lone(self, calls: list[_Call]) -> bool:
        """Send ``calls`` (counted in flight already) on the fleet's open channels, in
        one command; False (nothing sent) when no host lives or Redis refused."""
        if not self.lone or not self.pool.watch():
            return False
        pairs = [(call.snippet, self._limits_of(call)) for call in calls]
        try:
            futures = self.pool.calls.submit_many(pairs, run=self.run, deadline_s=self.deadline_s)
        except (redis.RedisError, CodepoolError) as exc:
            log.warning("could not send %d lone calls (a batch instead): %s", len(calls), exc)
            return False
        for call, future in zip(calls, futures, strict=True):
            with self._count_lock:
                call.lone = future
                given_up = call.given_up
            if given_up:  # given up on while it went out
                future.cancel()
            future.add_done_callback(functools.partial(self._lone_done, call))
        return True

    def _limits_of(self, call: _Call) -> Limits:
        wanted = {**self.limits, **dict(call.overrides)}
        try:  # the same few overrides, call after call
            return _limits_with(self.pool.limits, tuple(sorted(wanted.items())))
        except TypeError:  # an unhashable value
            return self.pool.limits.with_overrides(**wanted)

    def _lone_done(self, call: _Call, future: Future[ExecResult]) -> None:
        if future.cancelled():
            self._resolve(call, cancelled(CLOSED_MESSAGE))  # dropped if its caller gave up
            return
        self._resolve(call, future.result())

    def _dispatch(self, calls: list[_Call]) -> None:
        with self._count_lock:
            # A call given up on before it went out never goes out.
            calls = [call for call in calls if not call.given_up]
            self._in_flight += len(calls)
        groups: dict[tuple[tuple[str, Any], ...], list[_Call]] = {}
        for call in calls:
            groups.setdefault(call.overrides, []).append(call)
        for group in groups.values():
            self._submit_batch(group, collect_here=False)

    def _submit_batch(self, calls: list[_Call], *, collect_here: bool = True) -> None:
        """Submit ``calls`` (counted in flight already) as one batch and collect it here
        or on a collector thread."""
        limits = {**self.limits, **dict(calls[0].overrides)}
        deadline_s = self.deadline_s
        if deadline_s is None:
            deadline_s = limits["timeout_s"] + 300.0
        try:
            batch = self.pool.submit(
                [call.snippet for call in calls],
                run=self.run,
                deadline_s=deadline_s,
                **limits,
            )
        except CodepoolError as exc:
            log.error("could not submit a batch of %d snippets: %s", len(calls), exc)
            for call in calls:
                self._resolve(call, infra(f"codepool: {exc}"))
            return
        with self._count_lock:
            for index, call in enumerate(calls):
                call.batch, call.index = batch, index
            given_up = [call for call in calls if call.given_up]
        for call in given_up:  # given up on while the batch went out
            self._give_up(call)
        if collect_here:
            self._collect(batch, calls)
        else:
            self._collectors.submit(self._collect, batch, calls)

    def _collect(self, batch: Batch, calls: list[_Call]) -> None:
        resolved: set[int] = set()
        try:
            for index, result in batch.as_completed():
                resolved.add(index)
                self._resolve(calls[index], result)
        except Exception as exc:  # a collector must never leave a caller hanging
            log.exception("batch %s: collecting results failed", batch.id)
            for index, call in enumerate(calls):
                if index not in resolved:
                    self._resolve(call, infra(f"codepool: {exc}"))

    def _resolve(self, call: _Call, result: ExecResult) -> None:
        """Hand ``result`` to the call's caller, unless it gave up (its future is
        cancelled: the result is dropped, and its batch mates are not touched)."""
        with self._count_lock:
            self._in_flight -= 1
        if call.future.cancelled():
            return
        # latency as the reference measured it: around the caller's call.
        result = result.replace(latency=time.monotonic() - call.started)
        if result.status != CANCELLED:  # a closed sandbox's: not a call that ran
            self.stats.record(result)
        try:
            call.future.set_result(result)
        except InvalidStateError:
            pass  # cancelled just now
