"""The chaos run's recorded history (ops/bench/chaos.py): what each producer process asked
for and what came back, one JSON line per event, and the snippets it asks for.

Each producer process appends to a file of its own and flushes every line, so a producer
killed -9 leaves everything up to its last event (at most a torn last line, which
``read_events`` skips). Events:

- ``invoke``: an operation ``id`` of ``kind`` (batch, lone, ctx, http) was started; ``expect``
  is the stdout an ``ok`` result must have; ``may_cancel`` marks one its caller may give
  up on (its result may then be ``cancelled``).
- ``complete``: its result as the caller saw it: ``status``, ``stdout``, ``message`` (the
  start of stderr for statuses other than ok/error), ``worker``, ``latency``; for a batch
  snippet also ``batch`` and ``index`` (where its result lives in Redis).
- ``abandon``: the caller gave up on it (a cancelled ``arun_code``, an HTTP client that
  disconnected): no result is owed to it.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from codepool.common.result import ExecResult

MESSAGE_CHARS = 300


def cheap_snippet(rng: random.Random) -> tuple[str, str]:
    """A snippet that costs a fork and a print, and the stdout it must have."""
    a, b = rng.randrange(1, 10**9), rng.randrange(1, 10**6)
    return f"print({a} * {b})", f"{a * b}\n"


def slow_snippet(rng: random.Random, sleep_s: float) -> tuple[str, str]:
    """A snippet that sleeps ``sleep_s`` first: in flight long enough to be given up on."""
    code, expect = cheap_snippet(rng)
    return f"import time\ntime.sleep({sleep_s:.2f})\n{code}", expect


@dataclass
class Recorder:
    """Appends one producer's events to ``path`` (thread-safe)."""

    path: Path
    producer: str
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._file = open(self.path, "a", buffering=1, encoding="utf-8")

    def _write(self, event: dict[str, Any]) -> None:
        event = {"t": time.time(), "producer": self.producer, **event}
        line = json.dumps(event, separators=(",", ":")) + "\n"
        with self._lock:
            self._file.write(line)
            self._file.flush()

    def invoke(
        self, op_id: str, kind: str, expect: str, *, may_cancel: bool = False, **where: Any
    ) -> None:
        self._write(
            {
                "op": "invoke",
                "id": op_id,
                "kind": kind,
                "expect": expect,
                "may_cancel": may_cancel,
                **where,
            }
        )

    def complete(self, op_id: str, result: ExecResult, **where: Any) -> None:
        message = "" if result.status in ("ok", "error") else result.stderr[:MESSAGE_CHARS]
        self._write(
            {
                "op": "complete",
                "id": op_id,
                "status": result.status,
                "stdout": result.stdout,
                "message": message,
                "worker": result.worker,
                "latency": round(result.latency, 4),
                **where,
            }
        )

    def outcome(self, op_id: str, status: str, stdout: str, message: str = "") -> None:
        """A result that did not come as an ExecResult (an HTTP client's)."""
        self._write(
            {"op": "complete", "id": op_id, "status": status, "stdout": stdout, "message": message}
        )

    def abandon(self, op_id: str) -> None:
        self._write({"op": "abandon", "id": op_id})

    def close(self) -> None:
        self._file.close()


def read_events(path: Path) -> Iterator[dict[str, Any]]:
    """Every whole event in ``path`` (a torn last line, from a kill -9, is skipped)."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.endswith("\n"):
                return
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue


def read_history(directory: Path) -> list[dict[str, Any]]:
    """All producers' events in ``directory`` (``*.jsonl``), by time."""
    events = [event for path in sorted(directory.glob("*.jsonl")) for event in read_events(path)]
    return sorted(events, key=lambda event: float(event["t"]))
