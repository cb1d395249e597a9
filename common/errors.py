"""codepool's own faults. A failing user program is an ExecResult, never one of these."""

from __future__ import annotations


class CodepoolError(Exception):
    """Raised for any fault of codepool itself (base of the tree)."""


class ConfigError(CodepoolError):
    """Raised when a setting or a limit is out of range or malformed."""


class WireError(CodepoolError):
    """Raised when a payload cannot be encoded or decoded by the codec."""


class ExecutorError(CodepoolError):
    """Raised when the local executor cannot start or has been closed."""


class ContextError(ExecutorError):
    """Raised when an interpreter context cannot be opened or forked (the host's cap,
    a failed fork), or is used after its caller closed it."""


class RedisUnavailable(CodepoolError):
    """Raised when Redis cannot be reached within the caller's deadline."""


class InputError(CodepoolError):
    """Raised when an input file cannot be read as rollouts at all (format, columns)."""


class MissingExtra(CodepoolError):
    """Raised when a feature needs an optional dependency (an extra) that is not installed."""
