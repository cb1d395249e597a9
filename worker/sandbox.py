"""LocalSandbox: the reference ``LocalPythonSandbox`` API over a LocalExecutor."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any

from codepool.common.limits import Limits
from codepool.common.observation import DEFAULT_MARKERS, format_tool_content
from codepool.common.result import ExecResult
from codepool.common.sandbox_stats import SandboxStats
from codepool.worker.engine.context import Context
from codepool.worker.engine.executor import DEFAULT_PRELOAD, LocalExecutor


class LocalSandbox:
    """Drop-in for the reference sandbox: ``run_code``, ``arun_code``,
    ``format_tool_content`` and ``stats.metrics()``, running snippets on this host.

    timeout: wall-clock seconds per call. max_concurrency: snippets at once (default
    the CPUs this process may use, as LocalExecutor's ``concurrency``).
    ``context()``/``acontext()`` open interpreter contexts (state kept between calls).
    Other keywords (memory_mb, auto_print, ...) are Limits fields.
    """

    def __init__(
        self,
        timeout: float = 30.0,
        max_concurrency: int | None = None,
        *,
        mode: str = "fork",
        preload: Iterable[str] = DEFAULT_PRELOAD,
        markers: Mapping[str, str] = DEFAULT_MARKERS,
        **limits: Any,
    ) -> None:
        self.timeout = timeout
        self.markers = markers
        self.limits = Limits().with_overrides(timeout_s=timeout, **limits)
        self.executor = LocalExecutor(
            concurrency=max_concurrency, mode=mode, preload=preload, limits=self.limits
        )
        self.stats = SandboxStats()

    def run_code(self, code: str) -> ExecResult:
        result = self.executor.run(code)
        self.stats.record(result)
        return result

    async def arun_code(self, code: str) -> ExecResult:
        # The future is bound to whichever loop awaits it, so a new asyncio.run() per
        # rollout step works with the same sandbox.
        result = await asyncio.wrap_future(self.executor.submit(code))
        self.stats.record(result)
        return result

    def context(self, **limits: Any) -> Context:
        """An interpreter context: state kept between its calls, forkable (see
        worker/engine/context.py). Keywords: Limits fields over the sandbox's."""
        return self.executor.context(**limits)

    async def acontext(self, **limits: Any) -> Context:
        return await self.executor.acontext(**limits)

    def format_tool_content(self, result: ExecResult) -> str:
        return format_tool_content(result, timeout_s=self.timeout, markers=self.markers)

    def close(self) -> None:
        self.executor.close()

    def __enter__(self) -> LocalSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
