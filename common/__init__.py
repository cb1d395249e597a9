"""Wire types, codec, limits and observation text shared by producers and workers.

The names below load on first use, so importing one submodule (the fork-mode
child's ``autoprint``) does not load them all.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from codepool.common.autoprint import compile_snippet
    from codepool.common.error_types import error_type
    from codepool.common.errors import (
        CodepoolError,
        ConfigError,
        ExecutorError,
        InputError,
        MissingExtra,
        RedisUnavailable,
        WireError,
    )
    from codepool.common.limits import Limits
    from codepool.common.observation import (
        DEFAULT_MARKERS,
        format_tool_content,
        sanitize,
        truncate_tail,
    )
    from codepool.common.result import LIMITS, STATUSES, ExecResult
    from codepool.common.sandbox_stats import SandboxStats
    from codepool.common.snippet import Snippet

_HOMES = {
    "CodepoolError": "codepool.common.errors",
    "ConfigError": "codepool.common.errors",
    "DEFAULT_MARKERS": "codepool.common.observation",
    "ExecResult": "codepool.common.result",
    "ExecutorError": "codepool.common.errors",
    "InputError": "codepool.common.errors",
    "LIMITS": "codepool.common.result",
    "Limits": "codepool.common.limits",
    "MissingExtra": "codepool.common.errors",
    "RedisUnavailable": "codepool.common.errors",
    "STATUSES": "codepool.common.result",
    "SandboxStats": "codepool.common.sandbox_stats",
    "Snippet": "codepool.common.snippet",
    "WireError": "codepool.common.errors",
    "compile_snippet": "codepool.common.autoprint",
    "error_type": "codepool.common.error_types",
    "format_tool_content": "codepool.common.observation",
    "sanitize": "codepool.common.observation",
    "truncate_tail": "codepool.common.observation",
}

__all__ = [
    "DEFAULT_MARKERS",
    "LIMITS",
    "STATUSES",
    "CodepoolError",
    "ConfigError",
    "ExecResult",
    "ExecutorError",
    "InputError",
    "Limits",
    "MissingExtra",
    "RedisUnavailable",
    "SandboxStats",
    "Snippet",
    "WireError",
    "compile_snippet",
    "error_type",
    "format_tool_content",
    "sanitize",
    "truncate_tail",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value
