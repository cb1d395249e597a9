"""Context: the caller's handle on an interpreter context (see context_child.py for
what runs, context_host.py for the supervisor's side).

``executor.context(**limits)`` opens one; ``run_code`` runs a call in it and returns
that call's ExecResult alone (its own stdout and stderr, classified and truncated as a
snippet's, so ``format_tool_content`` works unchanged); ``fork(n)`` gives n new contexts
that start from a copy of its state (variables, modules, work dir files); ``close`` ends
it. A call that times out or reaches the CPU or memory limit ends the context, as does
an idle TTL or the executor restarting: its state is gone, ``ended`` says why, and later
calls come back ``rejected`` saying so (a model reads it as a tool error, no exception
in the rollout loop). Using a context after closing it is the caller's bug: that raises
ContextError.

``history`` is the code of the successful calls, in order, forks inheriting their
parent's: what a rebuild on another host would replay.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol

from codepool.common.errors import ContextError
from codepool.common.limits import Limits
from codepool.common.result import ExecResult, rejected

# Why a context ended when its executor's supervisor went (killed, crashed): nothing of
# the caller's ended it, so a caller that recorded its calls may rebuild it.
RESTARTED = "the executor restarted: the context's state is gone"


class ContextChannel(Protocol):
    """What a context sends its orders through: the supervisor client
    (worker/engine/client.py) that opened it."""

    name: str

    def _context_call(
        self, context_id: int, code: str, limits: Limits, before: Callable[[ExecResult], None]
    ) -> Future[ExecResult]: ...

    def _context_fork(
        self, parent: Context, n: int, history: list[str]
    ) -> Future[list[Context]]: ...

    def _context_close(self, context_id: int) -> None: ...


# Why a context ended when its executor's supervisor went (killed, crashed): nothing of
# the caller's ended it, so a caller that recorded its calls may rebuild it.
RESTARTED = "the executor restarted: the context's state is gone"


class Context:
    """One interpreter context; thread-safe (calls on it run one at a time, in order).

    limits: its defaults for every call; per-call keywords override the per-call ones
    (timeout_s, cpu_s, max_output_chars, auto_print, rich_tracebacks). memory_mb,
    max_procs and max_file_mb are the context's, fixed when it was opened.
    """

    def __init__(
        self,
        client: ContextChannel,
        context_id: int,
        limits: Limits,
        *,
        pid: int,
        history: list[str] | None = None,
    ) -> None:
        self._client = client
        self.id = context_id
        self.limits = limits
        self.pid = pid  # its interpreter's pid, as the executor's host sees it
        self.history: list[str] = list(history or [])
        self.ended: str | None = None  # why it ended, once it did
        self._closed = False
        self._lock = threading.Lock()

    # -- calls -----------------------------------------------------------------------

    def submit(self, code: str, **limits: Any) -> Future[ExecResult]:
        """Queue a call; the future resolves to its ExecResult."""
        self._check_open()
        if self.ended is not None:
            future: Future[ExecResult] = Future()
            future.set_result(self._refused())
            return future
        if not isinstance(code, str):
            raise ContextError(f"code must be str, got {type(code).__name__}")
        effective = self.limits.with_overrides(**limits)
        # Recorded before the future resolves, so a fork right after sees it.
        return self._client._context_call(
            self.id, code, effective, lambda r: self._remember(code, r)
        )

    def run_code(self, code: str, **limits: Any) -> ExecResult:
        """Run ``code`` in this context and wait for its result."""
        return self.submit(code, **limits).result()

    async def arun_code(self, code: str, **limits: Any) -> ExecResult:
        """``run_code`` for asyncio (any loop, a new one per step included)."""
        return await asyncio.wrap_future(self.submit(code, **limits))

    def _remember(self, code: str, result: ExecResult) -> None:
        if result.status == "ok":
            with self._lock:
                self.history.append(code)

    def _refused(self) -> ExecResult:
        return rejected(f"rejected: the context ended: {self.ended}", worker=self._client.name)

    # -- forks -----------------------------------------------------------------------

    def submit_fork(self, n: int = 1) -> Future[list[Context]]:
        """Queue a fork order; the future resolves to the n new contexts (or raises
        ContextError: the host's cap, a fork that failed, this context ended)."""
        self._check_open()
        if self.ended is not None:
            raise ContextError(f"cannot fork: the context ended: {self.ended}")
        with self._lock:
            history = list(self.history)
        return self._client._context_fork(self, n, history)

    def fork(self, n: int = 1) -> list[Context]:
        """n new contexts, each starting from a copy of this one's state at this point
        (after the calls submitted before it)."""
        return self.submit_fork(n).result()

    async def afork(self, n: int = 1) -> list[Context]:
        return await asyncio.wrap_future(self.submit_fork(n))

    # -- end -------------------------------------------------------------------------

    def close(self) -> None:
        """End the context (idempotent): its process and work dir go."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self.ended is None:
            self.ended = "closed by its caller"
            self._client._context_close(self.id)

    async def aclose(self) -> None:
        self.close()

    def _end(self, reason: str) -> None:
        """The executor ended it (a limit, the TTL, a restart)."""
        if self.ended is None:
            self.ended = reason

    def _check_open(self) -> None:
        if self._closed:
            raise ContextError("the context was closed by its caller")

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Context:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "open" if self.ended is None else f"ended: {self.ended}"
        return f"<Context {self.id} ({state})>"
