"""``codepool replay --report FILE.html``: one self-contained HTML page from a replay's
output: the status, limit and error-type breakdowns, the run-time histogram and, for a
``--compare`` replay, the observations that changed, each as a side-by-side diff."""

from __future__ import annotations

import difflib
import html
import json
from collections import Counter
from dataclasses import dataclass, field

from codepool.common.error_types import ranked
from codepool.common.quantile import nearest_rank
from codepool.ops.charts import bar_chart, column_chart, number
from codepool.producer.compare import Comparison, only_whitespace_differs

STATUS_COLORS = {
    "ok": "#2e7d32",
    "error": "#c62828",
    "timeout": "#ef6c00",
    "memory": "#6a1b9a",
    "signal": "#ad1457",
    "rejected": "#546e7a",
    "infra": "#000000",
}
ERROR_TYPE_COLOR = "#c62828"
LIMIT_COLOR = "#6d4c41"
# Log-spaced buckets from 0.5 ms to 60 s: snippet run times span five decades.
BUCKET_EDGES_S = [0.0005 * 2**k for k in range(18)]
MAX_DIFFS = 100  # changed observations shown as diffs; the output file has them all
DIFF_WRAP_CHARS = 70

STYLE = """
body{font-family:sans-serif;margin:2em;max-width:1400px}
td,th{padding:2px 10px;text-align:right}
td:first-child,th:first-child{text-align:left}
td:first-child{overflow-wrap:anywhere;max-width:40em}
svg.chart{max-width:100%;height:auto;display:block;margin:1em 0}
table.diff{font-family:monospace;border-collapse:collapse;margin:.5em 0 1.5em;text-align:left}
table.diff td,table.diff th{text-align:left;vertical-align:top;padding:1px 6px}
.diff_header{background:#eee;color:#555}
.diff_next{display:none}
.diff_add{background:#c8f0c8}.diff_chg{background:#f7f0a0}.diff_sub{background:#f5c0c0}
"""


@dataclass
class ReplayOutput:
    """What a replay's output file holds, tallied for the report."""

    statuses: Counter[str] = field(default_factory=Counter)
    error_types: Counter[str] = field(default_factory=Counter)
    limits: Counter[str] = field(default_factory=Counter)
    exec_s: list[float] = field(default_factory=list)
    comparison: Comparison = field(default_factory=Comparison)
    compared: bool = False  # any line carries a comparison
    changed: list[tuple[str, str, str]] = field(default_factory=list)  # id, recorded, now


def load(out_path: str) -> ReplayOutput:
    """Tally a replay's output file (unreadable lines are passed over)."""
    data = ReplayOutput()
    with open(out_path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not isinstance(record, dict):
                continue
            _add(data, record)
    return data


def _add(data: ReplayOutput, record: dict[str, object]) -> None:
    status = str(record.get("status"))
    data.statuses[status] += 1
    exec_s = record.get("exec_s")
    data.exec_s.append(float(exec_s) if isinstance(exec_s, int | float) else 0.0)
    # Lines of a replay from before error types were recorded count under their status.
    kind = record.get("error_type", None if status == "ok" else status)
    if kind is not None:
        data.error_types[str(kind)] += 1
    # Lines of a replay from before limits were recorded name none.
    limit = record.get("limit")
    if isinstance(limit, str):
        data.limits[limit] += 1
    if "match" not in record:
        return
    data.compared = True
    recorded, observation = record.get("recorded"), str(record.get("observation", ""))
    if not isinstance(recorded, str):
        data.comparison.add(None, observation)
    elif data.comparison.add(recorded, observation) is False and len(data.changed) < MAX_DIFFS:
        data.changed.append((str(record.get("id")), recorded, observation))


def histogram(values_s: list[float]) -> list[tuple[float, int]]:
    """(upper edge in s, count) per bucket; the last bucket takes everything above."""
    counts = [0] * len(BUCKET_EDGES_S)
    for value in values_s:
        index = next(
            (i for i, edge in enumerate(BUCKET_EDGES_S) if value <= edge), len(BUCKET_EDGES_S) - 1
        )
        counts[index] += 1
    return list(zip(BUCKET_EDGES_S, counts, strict=True))


def bucket_label(edge_s: float, *, last: bool = False) -> str:
    """``≤0.5 ms``, ``≤16 ms``, ``≤2 s``; the last bucket also holds everything above."""
    if last:
        return f">{edge_s / 2:.3g} s"
    return f"≤{edge_s * 1e3:g} ms" if edge_s < 1 else f"≤{edge_s:.3g} s"


def render(data: ReplayOutput, title: str) -> str:
    total = sum(data.statuses.values())
    failed = sum(data.error_types.values())
    status_items = [(s, c, STATUS_COLORS.get(s, "#888")) for s, c in data.statuses.most_common()]
    type_items = [(t, c, ERROR_TYPE_COLOR) for t, c in ranked(data.error_types)]
    p50, p95 = nearest_rank(data.exec_s, 0.5) * 1e3, nearest_rank(data.exec_s, 0.95) * 1e3
    overview = f"{number(total)} calls; run time p50 {p50:.1f} ms, p95 {p95:.1f} ms."
    sections = [
        f"<h1>{html.escape(title)}</h1>",
        f"<p>{overview if total else 'No calls.'}</p>",
        "<h2>Status breakdown</h2>",
        bar_chart(status_items),
        _table(("status", "count", "share"), status_items, total),
        "<h2>Limits reached</h2>",
        *_limits(data, total),
        "<h2>Error types</h2>",
    ]
    if type_items:
        sections += [
            bar_chart(type_items, value_title="failed calls"),
            _table(("error type", "count", "share of failures"), type_items, failed),
        ]
    else:
        sections.append("<p>No call failed.</p>")
    sections += ["<h2>Run-time histogram</h2>", _histogram(data.exec_s)]
    if data.compared:
        sections += _comparison(data)
    body = "\n".join(sections)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{STYLE}</style>
</head><body>
{body}
</body></html>
"""


def _limits(data: ReplayOutput, total: int) -> list[str]:
    if not data.limits:
        return ["<p>No call reached a limit.</p>"]
    items = [(name, count, LIMIT_COLOR) for name, count in ranked(data.limits)]
    note = (
        "<p>The limit that stopped each call; <code>output</code>: the output cap cut what "
        "it printed and no other limit stopped it.</p>"
    )
    return [
        note,
        bar_chart(items, value_title="calls"),
        _table(("limit", "count", "share of calls"), items, total),
    ]


def _table(headers: tuple[str, str, str], items: list[tuple[str, int, str]], total: int) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    rows = "".join(
        f"<tr><td>{html.escape(label)}</td><td>{number(count)}</td>"
        f"<td>{count / max(1, total):.1%}</td></tr>"
        for label, count, _ in items
    )
    return f"<table><tr>{head}</tr>{rows}</table>"


def _histogram(exec_s: list[float]) -> str:
    buckets = histogram(exec_s)
    used = [i for i, (_, count) in enumerate(buckets) if count]
    if not used:
        return "<p>No calls.</p>"
    last_index = len(buckets) - 1
    items = [
        (bucket_label(edge, last=i == last_index), count)
        for i, (edge, count) in enumerate(buckets)
        if used[0] <= i <= used[-1]
    ]
    return column_chart(
        items, color="#1565c0", x_title="run time (bucket upper edge)", y_title="calls"
    )


def _comparison(data: ReplayOutput) -> list[str]:
    comparison = data.comparison
    sections = [
        "<h2>Observations compared with the recorded ones</h2>",
        f"<p>{html.escape(comparison.describe())}.</p>",
    ]
    if comparison.changed > len(data.changed):
        sections.append(
            f"<p>The first {len(data.changed)} changed ones are shown; every line of the "
            'output with <code>"match": false</code> is one.</p>'
        )
    differ = difflib.HtmlDiff(wrapcolumn=DIFF_WRAP_CHARS)
    for call_id, recorded, observation in data.changed:
        note = " (only leading/trailing whitespace differs)"
        note = note if only_whitespace_differs(recorded, observation) else ""
        sections.append(f"<h3>{html.escape(call_id)}{note}</h3>")
        table = differ.make_table(
            recorded.split("\n"),
            observation.split("\n"),
            fromdesc="recorded (what the policy saw)",
            todesc="replayed (now)",
            context=True,
            numlines=3,
        )
        sections.append(table)
    return sections


def write_report(out_path: str, report_path: str) -> None:
    data = load(out_path)
    with open(report_path, "w", encoding="utf-8") as f:
        f.write(render(data, f"codepool replay: {out_path}"))
