"""Thread-safe in-process counters behind the reference ``stats.metrics()`` API."""

from __future__ import annotations

import threading
from collections import Counter

from codepool.common import counters
from codepool.common.result import ExecResult


class SandboxStats:
    """Counts results and reports the reference sandbox's ``sandbox/*`` metrics."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def record(self, result: ExecResult) -> None:
        increments = counters.count(result)
        with self._lock:
            self._counts.update(increments)

    def metrics(self) -> dict[str, float]:
        """``sandbox/success_rate``, ``error_rate``, ``timeout_rate``, mean ``latency`` (s)."""
        with self._lock:
            snapshot = dict(self._counts)
        return counters.metrics(snapshot)

    def reset(self) -> None:
        with self._lock:
            self._counts.clear()
