"""Per-snippet resource limits, with the worker-side clamp."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from codepool.common.errors import ConfigError

MAX_CODE_BYTES = 256 * 1024
# The limits that are sizes and counts: positive ints, clamped to the worker's ceiling.
_POSITIVE_INTS = (
    "memory_mb",
    "max_procs",
    "max_file_mb",
    "max_output_chars",
    "max_code_bytes",
    "max_stdin_bytes",
    "max_files_bytes",
    "max_fetch_bytes",
)


@dataclass(frozen=True, slots=True)
class Limits:
    """What one snippet may use. Units are in the names.

    timeout_s: wall clock, after which everything the snippet started is killed.
    cpu_s: CPU seconds (RLIMIT_CPU); ``None`` means ``timeout_s + 5``.
    memory_mb: address space the snippet may add on top of the interpreter it starts from.
    max_procs: processes and threads the snippet may have at once.
    max_file_mb: largest file (and stdout/stderr stream) the snippet may write.
    max_output_chars: characters of stdout and of stderr kept (the tail).
    auto_print: print the value of a trailing expression, like a notebook cell.
    max_code_bytes: largest accepted source, in UTF-8 bytes.
    rich_tracebacks: show source lines and ``^~~`` markers in tracebacks; off, a
        traceback reads as the reference sandbox's (``File "<sandbox>", line N, in f``).
    max_stdin_bytes: largest stdin a snippet may be given.
    max_files_bytes: largest total size of the files written into its work dir.
    max_fetch_bytes: largest total size of the files read back after it ends.
    """

    timeout_s: float = 30.0
    cpu_s: float | None = None
    memory_mb: int = 1024
    max_procs: int = 32
    max_file_mb: int = 16
    max_output_chars: int = 4096
    auto_print: bool = False
    max_code_bytes: int = MAX_CODE_BYTES
    rich_tracebacks: bool = False
    max_stdin_bytes: int = 8 << 20
    max_files_bytes: int = 32 << 20
    max_fetch_bytes: int = 16 << 20

    def __post_init__(self) -> None:
        for name in ("timeout_s", "cpu_s"):
            value = getattr(self, name)
            if value is None and name == "cpu_s":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"{name} must be a number, got {type(value).__name__}")
            if not math.isfinite(value) or value <= 0:
                raise ConfigError(f"{name} must be a positive finite number, got {value!r}")
        for name in _POSITIVE_INTS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{name} must be an int, got {type(value).__name__}")
            if value <= 0:
                raise ConfigError(f"{name} must be positive, got {value!r}")
        for name in ("auto_print", "rich_tracebacks"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be a bool")

    @property
    def effective_cpu_s(self) -> float:
        return self.cpu_s if self.cpu_s is not None else self.timeout_s + 5.0

    @property
    def cpu_rlimit_s(self) -> int:
        """The RLIMIT_CPU a child gets, in whole seconds: SIGXCPU there, SIGKILL a
        second later."""
        return math.ceil(self.effective_cpu_s)

    def with_overrides(self, **overrides: Any) -> Limits:
        """These limits with some fields replaced; unknown names raise ConfigError."""
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise ConfigError(f"unknown limit(s): {', '.join(unknown)}")
        return dataclasses.replace(self, **overrides) if overrides else self

    def clamp(self, maxima: Limits) -> Limits:
        """These limits, none above ``maxima`` (the worker's own ceiling)."""
        cpu = self.cpu_s
        if cpu is not None or maxima.cpu_s is not None:
            cpu = min(self.effective_cpu_s, maxima.effective_cpu_s)
        lowest = {name: min(getattr(self, name), getattr(maxima, name)) for name in _POSITIVE_INTS}
        return dataclasses.replace(
            self, timeout_s=min(self.timeout_s, maxima.timeout_s), cpu_s=cpu, **lowest
        )

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Limits:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(f"unknown limit(s): {', '.join(unknown)}")
        return cls(**data)
