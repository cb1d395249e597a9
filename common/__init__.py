"""Wire types, codec, limits and observation text shared by producers and workers."""

from __future__ import annotations

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
from codepool.common.result import STATUSES, ExecResult
from codepool.common.sandbox_stats import SandboxStats
from codepool.common.snippet import Snippet

__all__ = [
    "DEFAULT_MARKERS",
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
