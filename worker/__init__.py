"""The worker side: the host executor (worker/engine: supervisor, zygotes, limits,
isolation), the worker host and its RQ dispatchers, leases and result writers.

Imports are lazy so the spawn-mode runner (worker/engine/spawn_entry.py) starts
without loading the executor's machinery.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from codepool.worker.engine.executor import LocalExecutor
    from codepool.worker.sandbox import LocalSandbox

__all__ = ["LocalExecutor", "LocalSandbox"]


def __getattr__(name: str) -> Any:
    if name == "LocalExecutor":
        from codepool.worker.engine.executor import LocalExecutor

        return LocalExecutor
    if name == "LocalSandbox":
        from codepool.worker.sandbox import LocalSandbox

        return LocalSandbox
    raise AttributeError(name)
