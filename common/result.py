"""ExecResult: the observation of one snippet, drop-in for the reference sandbox's."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

STATUSES = ("ok", "error", "timeout", "memory", "signal", "rejected", "infra")
# The limits that can stop a snippet, as ExecResult.limit names them (Limits field in
# brackets): wall time (timeout_s), CPU time (cpu_s), memory (memory_mb), the output cap
# (max_output_chars: it cuts what is kept and never stops the snippet), file size
# (max_file_mb) and the process cap (max_procs). See worker/engine/outcome.py.
LIMITS = ("wall_time", "cpu_time", "memory", "output", "file_size", "processes")
# A snippet its caller gave up on (Batch.cancel, a cancelled arun_code, a closed sandbox,
# a lapsed producer): it has no result of its own and is counted apart from ``calls``.
CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class ExecResult:
    """Outcome of running one snippet.

    The first six fields keep the reference ``LocalPythonSandbox`` meaning and order:
    ``ok`` is true exactly when the process exited 0 without timing out; ``returncode``
    is ``None`` on timeout and ``-N`` when killed by signal N; ``latency`` is the wall
    time in seconds seen by the caller. The rest are codepool's extras; ``limit`` names
    the limit (one of LIMITS) that stopped the snippet or, when none did, ``"output"``
    if the output cap cut its output (``truncated`` says that in any case); ``None``
    when no limit was reached, and for results that never ran.
    """

    ok: bool
    stdout: str
    stderr: str
    returncode: int | None
    timed_out: bool
    latency: float
    status: str = "ok"
    signal: int | None = None
    truncated: bool = False
    exec_s: float = 0.0
    queue_s: float = 0.0
    cpu_s: float = 0.0
    max_rss_kb: int = 0
    worker: str = ""
    zygote: str = ""  # fork mode: "bare", "light", "mid" or "heavy": the zygote that cloned it
    # Snippet.fetch_files that were found: relative path -> content.
    files: dict[str, bytes] = field(default_factory=dict)
    # Notebook cells (Snippet.cells), one map each: stdout, stderr, display (a list of
    # {"text/plain": repr} for a trailing expression), error (a list of {ename, evalue,
    # traceback}). A cell the snippet never reached (killed, timed out) has no entry.
    cells: list[dict[str, Any]] = field(default_factory=list)
    limit: str | None = None
    # An interpreter context's call that ran on a context rebuilt on another host (its
    # host was lost; the context's earlier successful calls were replayed first).
    rebuilt: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExecResult:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def replace(self, **changes: Any) -> ExecResult:
        return dataclasses.replace(self, **changes)


def not_run(status: str, message: str, *, latency: float = 0.0, worker: str = "") -> ExecResult:
    """A result for a snippet that never ran: ``rejected`` input or an ``infra`` fault."""
    return ExecResult(
        ok=False,
        stdout="",
        stderr=message,
        returncode=None,
        timed_out=False,
        latency=latency,
        status=status,
        worker=worker,
    )


def rejected(message: str, *, latency: float = 0.0, worker: str = "") -> ExecResult:
    """A result for input that was refused before anything ran."""
    return not_run("rejected", message, latency=latency, worker=worker)


def infra(message: str, *, latency: float = 0.0, worker: str = "") -> ExecResult:
    """A result for a snippet codepool could not run (executor or queue fault)."""
    return not_run("infra", message, latency=latency, worker=worker)


def cancelled(message: str, *, latency: float = 0.0, worker: str = "") -> ExecResult:
    """What stands for a snippet its caller gave up on: it did not run to its end (or at
    all), and what it would have printed is gone."""
    return not_run(CANCELLED, message, latency=latency, worker=worker)
