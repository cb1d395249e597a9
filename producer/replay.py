"""Replay a saved rollout batch through the pool: one output line per code call.

Output lines: ``{"id", "status", "observation", "latency_s", "exec_s", "queue_s",
"returncode", "timed_out", "truncated", "error_type", "limit"}``, where ``observation``
is exactly the tool message the policy would see now and ``limit`` the limit that stopped
the call (ExecResult.limit, or null); with ``compare``, also ``recorded`` (the one it saw,
or null) and ``match`` (see producer.compare). Resumable: ids already in the output are
skipped.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from codepool.common.error_types import error_type
from codepool.common.observation import format_tool_content
from codepool.common.quantile import nearest_rank
from codepool.common.result import ExecResult
from codepool.producer.compare import Comparison
from codepool.producer.pool import CodePool
from codepool.producer.rollout_files import read_calls
from codepool.producer.rollouts import RecordedCall, RolloutError

CHUNK = 256  # calls per batch: enough to keep every slot busy, small enough to resume


@dataclass
class ReplaySummary:
    """What a replay did (skipped: already in the output; comparison: with ``compare``)."""

    statuses: Counter[str] = field(default_factory=Counter)
    error_types: Counter[str] = field(default_factory=Counter)
    limits: Counter[str] = field(default_factory=Counter)  # ExecResult.limit, when named
    exec_s: list[float] = field(default_factory=list)  # time each call ran
    skipped: int = 0
    bad_lines: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    comparison: Comparison | None = None
    left: int = 0  # calls not run: a stop was asked for (run again to resume)

    @property
    def ran(self) -> int:
        return sum(self.statuses.values())

    def percentile_ms(self, q: float) -> float:
        if not self.exec_s:
            return 0.0
        return nearest_rank(self.exec_s, q) * 1e3


def done_ids(path: str) -> set[str]:
    """Ids already written to a previous (maybe interrupted) replay's output."""
    if not os.path.exists(path):
        return set()
    ids = set()
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                ids.add(str(json.loads(line)["id"]))
            except (json.JSONDecodeError, KeyError, TypeError):
                continue  # a line cut short by an interrupted run is written again
    return ids


def drop_partial_last_line(path: str) -> None:
    """An interrupted run may leave half a line; cut it so appended lines stay whole."""
    if not os.path.exists(path):
        return
    with open(path, "rb+") as f:
        data = f.read()
        if data and not data.endswith(b"\n"):
            f.truncate(data.rfind(b"\n") + 1)


def output_record(call_id: str, result: ExecResult, timeout_s: float) -> dict[str, object]:
    return {
        "id": call_id,
        "status": result.status,
        "observation": format_tool_content(result, timeout_s=timeout_s),
        "latency_s": round(result.latency, 6),
        "exec_s": round(result.exec_s, 6),
        "queue_s": round(result.queue_s, 6),
        "returncode": result.returncode,
        "timed_out": result.timed_out,
        "truncated": result.truncated,
        "error_type": error_type(result),
        "limit": result.limit,
    }


def replay(
    pool: CodePool,
    in_path: str,
    out_path: str,
    *,
    timeout_s: float,
    run: str = "replay",
    compare: bool = False,
    on_progress: Callable[[int, int], None] | None = None,
    stopping: Callable[[], bool] = lambda: False,
    **limits: Any,
) -> ReplaySummary:
    """Run every call of ``in_path`` not yet in ``out_path``; append results as they come.

    ``in_path``: JSONL or Parquet (see producer.rollout_files); ``timeout_s``: seconds per
    call; ``compare``: add ``recorded`` and ``match`` to each line and count them in
    ``summary.comparison``; ``on_progress(done, total)`` is called after each result (the
    CLI draws a bar); once ``stopping()`` is true no further batch is submitted (the
    calls left are counted in ``summary.left``). Other keywords: Limits fields. A code
    record's fetched files come back as text in the line's ``files``.
    """
    summary = ReplaySummary(comparison=Comparison() if compare else None)
    drop_partial_last_line(out_path)
    already = done_ids(out_path)
    pending: list[RecordedCall] = []
    for item in read_calls(in_path):
        if isinstance(item, RolloutError):
            summary.bad_lines.append(str(item))
        elif item.id in already:
            summary.skipped += 1
        elif summary.comparison is None:
            pending.append(dataclasses.replace(item, recorded=None))  # not kept for nothing
        else:
            pending.append(item)
            if item.unreadable:
                summary.comparison.unreadable.append(f"{item.id}: {item.unreadable}")
    started = time.monotonic()
    with open(out_path, "a", encoding="utf-8") as out:
        for start, chunk in enumerate(_chunks(pending, CHUNK)):
            if stopping():
                summary.left = len(pending) - start * CHUNK
                break
            batch = pool.submit(
                [call.runs for call in chunk], run=run, timeout_s=timeout_s, **limits
            )
            for index, result in batch.as_completed():
                call = chunk[index]
                record = output_record(call.id, result, timeout_s)
                if call.snippet is not None and call.snippet.fetch_files:
                    record["files"] = {
                        path: data.decode("utf-8", "replace") for path, data in result.files.items()
                    }
                if summary.comparison is not None:
                    record["recorded"] = call.recorded
                    record["match"] = summary.comparison.add(
                        call.recorded, str(record["observation"])
                    )
                out.write(json.dumps(record, ensure_ascii=False) + "\n")
                out.flush()  # a killed replay keeps every line it finished
                summary.statuses[result.status] += 1
                kind = record["error_type"]
                if kind is not None:
                    summary.error_types[str(kind)] += 1
                if result.limit is not None:
                    summary.limits[result.limit] += 1
                summary.exec_s.append(result.exec_s)
                if on_progress is not None:
                    on_progress(summary.ran, len(pending))
    summary.wall_s = time.monotonic() - started
    return summary


def _chunks(calls: list[RecordedCall], size: int) -> Iterable[list[RecordedCall]]:
    for start in range(0, len(calls), size):
        yield calls[start : start + size]
