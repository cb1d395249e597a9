"""RemoteSandbox: drop-in for the reference ``LocalPythonSandbox``, backed by the pool.

Concurrent ``arun_code``/``run_code`` calls are coalesced: the first call of a burst
waits ``linger_s`` for company, then up to ``max_batch`` calls go out as one batch, which
every live host shares. So a rollout's ``asyncio.gather(*(sb.arun_code(c) for c in
codes))`` becomes one or a few batches. Calls resolve concurrent futures from background
threads, so the same sandbox works under a new ``asyncio.run`` per step, and from plain
threads.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from codepool.common.errors import CodepoolError
from codepool.common.observation import DEFAULT_MARKERS, format_tool_content
from codepool.common.result import ExecResult, infra
from codepool.common.sandbox_stats import SandboxStats
from codepool.common.settings import Settings
from codepool.common.snippet import split_inputs
from codepool.producer.pool import Batch, CodePool

log = logging.getLogger(__name__)

# A call: its snippet, its future, when it was made, and its Limits overrides (calls
# with the same overrides share batches).
_Call = tuple[Any, "Future[ExecResult]", float, tuple[tuple[str, Any], ...]]


class RemoteSandbox:
    """The reference sandbox API (``run_code``, ``arun_code``, ``format_tool_content``,
    ``stats.metrics()``) over a remote codepool.

    url: Redis URL (default ``$REDIS_URL``). timeout: seconds per snippet.
    run: run tag for the pool's per-run stats. linger_s / max_batch: coalescing.
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
        markers: Mapping[str, str] = DEFAULT_MARKERS,
        settings: Settings | None = None,
        **limits: Any,
    ) -> None:
        self.timeout = timeout
        self.run = run
        self.linger_s = linger_s
        self.max_batch = max_batch
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
        self._calls.put(call)
        return call[1]

    def _call(self, code: Any, keywords: dict[str, Any]) -> _Call:
        snippet, overrides = split_inputs(code, keywords)
        if overrides:
            self.pool.limits.with_overrides(**{**self.limits, **overrides})  # checked now
        return (snippet, Future(), time.monotonic(), tuple(sorted(overrides.items())))

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
        self._submit_batch([call])
        return call[1].result()

    async def arun_code(self, code: Any, **keywords: Any) -> ExecResult:
        """``run_code`` for async callers (any event loop)."""
        # wrap_future binds to whichever loop awaits, so asyncio.run per step works.
        return await asyncio.wrap_future(self.submit(code, **keywords))

    def format_tool_content(self, result: ExecResult) -> str:
        return format_tool_content(result, timeout_s=self.timeout, markers=self.markers)

    def close(self, *, wait: bool = True) -> None:
        """Stop taking calls. ``wait``: until every call made has its result; else at
        once, the calls still waiting resolved as ``infra`` (a server that stops)."""
        if self._closed:
            return
        self._closed = True
        self._calls.put(None)
        self._batcher.join(timeout=10)
        if not wait:
            self.pool.close()  # ends the collections (Batch.as_completed)
        self._collectors.shutdown(wait=True)
        self.pool.close()

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
            # Linger for company only when calls are already in flight (a rollout's
            # burst); a lone call on an idle sandbox goes out at once.
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

    def _dispatch(self, calls: list[_Call]) -> None:
        groups: dict[tuple[tuple[str, Any], ...], list[_Call]] = {}
        for call in calls:
            groups.setdefault(call[3], []).append(call)
        with self._count_lock:
            self._in_flight += len(calls)
        for group in groups.values():
            self._submit_batch(group, collect_here=False)

    def _submit_batch(self, calls: list[_Call], *, collect_here: bool = True) -> None:
        """Submit ``calls`` (counted in flight already) as one batch and collect it here
        or on a collector thread."""
        limits = {**self.limits, **dict(calls[0][3])}
        deadline_s = self.deadline_s
        if deadline_s is None:
            deadline_s = limits["timeout_s"] + 300.0
        try:
            batch = self.pool.submit(
                [snippet for snippet, _, _, _ in calls],
                run=self.run,
                deadline_s=deadline_s,
                **limits,
            )
        except CodepoolError as exc:
            log.error("could not submit a batch of %d snippets: %s", len(calls), exc)
            for call in calls:
                self._resolve(call, infra(f"codepool: {exc}"))
            return
        if collect_here:
            self._collect(batch, calls)
        else:
            self._collectors.submit(self._collect, batch, calls)

    def _collect(self, batch: Batch, calls: list[_Call]) -> None:
        try:
            for index, result in batch.as_completed():
                self._resolve(calls[index], result)
        except Exception as exc:  # a collector must never leave a caller hanging
            log.exception("batch %s: collecting results failed", batch.id)
            for call in calls:
                if not call[1].done():
                    self._resolve(call, infra(f"codepool: {exc}"))

    def _resolve(self, call: _Call, result: ExecResult) -> None:
        _, future, started, _ = call
        # latency as the reference measured it: around the caller's call.
        result = result.replace(latency=time.monotonic() - started)
        self.stats.record(result)
        with self._count_lock:
            self._in_flight -= 1
        if not future.done():  # an asyncio caller that gave up cancelled it
            future.set_result(result)
