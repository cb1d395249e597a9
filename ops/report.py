"""``codepool replay --report FILE.html``: the run-time histogram and the status
breakdown of a replay output, as one self-contained HTML page (inline SVG, no plotting
library needed)."""

from __future__ import annotations

import html
import json
from collections import Counter

from codepool.common.quantile import nearest_rank

STATUS_COLORS = {
    "ok": "#2e7d32",
    "error": "#c62828",
    "timeout": "#ef6c00",
    "memory": "#6a1b9a",
    "signal": "#ad1457",
    "rejected": "#546e7a",
    "infra": "#000000",
}
# Log-spaced buckets from 0.5 ms to 60 s: snippet run times span five decades.
BUCKET_EDGES_S = [0.0005 * 2**k for k in range(18)]


def load(out_path: str) -> tuple[Counter[str], list[float]]:
    statuses: Counter[str] = Counter()
    exec_s: list[float] = []
    with open(out_path, encoding="utf-8") as f:
        for line in f:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            statuses[str(record.get("status"))] += 1
            exec_s.append(float(record.get("exec_s") or 0.0))
    return statuses, exec_s


def histogram(values_s: list[float]) -> list[tuple[float, int]]:
    """(upper edge in s, count) per bucket; the last bucket takes everything above."""
    counts = [0] * len(BUCKET_EDGES_S)
    for value in values_s:
        index = next(
            (i for i, edge in enumerate(BUCKET_EDGES_S) if value <= edge), len(BUCKET_EDGES_S) - 1
        )
        counts[index] += 1
    return list(zip(BUCKET_EDGES_S, counts, strict=True))


def _bars(items: list[tuple[str, int, str]], width: int = 640, height: int = 220) -> str:
    peak = max((count for _, count, _ in items), default=0) or 1
    slot = width / max(1, len(items))
    parts = [f'<svg width="{width}" height="{height + 40}" xmlns="http://www.w3.org/2000/svg">']
    for i, (label, count, color) in enumerate(items):
        bar = height * count / peak
        x = i * slot
        parts.append(
            f'<rect x="{x + 2:.1f}" y="{height - bar:.1f}" width="{slot - 4:.1f}" '
            f'height="{bar:.1f}" fill="{color}"><title>{html.escape(label)}: '
            f"{count}</title></rect>"
        )
        parts.append(
            f'<text x="{x + slot / 2:.1f}" y="{height + 14}" font-size="10" '
            f'text-anchor="middle">{html.escape(label)}</text>'
        )
        parts.append(
            f'<text x="{x + slot / 2:.1f}" y="{height - bar - 3:.1f}" font-size="10" '
            f'text-anchor="middle">{count}</text>'
        )
    parts.append("</svg>")
    return "\n".join(parts)


def _label(edge_s: float) -> str:
    return f"≤{edge_s * 1e3:.0f}ms" if edge_s < 1 else f"≤{edge_s:.0f}s"


def render(statuses: Counter[str], exec_s: list[float], title: str) -> str:
    total = sum(statuses.values())
    status_items = [(s, c, STATUS_COLORS.get(s, "#888")) for s, c in statuses.most_common()]
    buckets = histogram(exec_s)
    last = max((i for i, (_, count) in enumerate(buckets) if count), default=0)
    hist_items = [(_label(edge), count, "#1565c0") for edge, count in buckets[: last + 1]]
    p50, p95 = nearest_rank(exec_s, 0.5) * 1e3, nearest_rank(exec_s, 0.95) * 1e3
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:2em}} td,th{{padding:2px 10px;text-align:right}}</style>
</head><body>
<h1>{html.escape(title)}</h1>
<p>{total} calls; run time p50 {p50:.1f} ms, p95 {p95:.1f} ms.</p>
<h2>Status breakdown</h2>
{_bars(status_items)}
<table><tr><th>status</th><th>count</th><th>share</th></tr>
{
        "".join(
            f"<tr><td>{html.escape(s)}</td><td>{c}</td><td>{c / max(1, total):.1%}</td></tr>"
            for s, c, _ in status_items
        )
    }
</table>
<h2>Run-time histogram</h2>
{_bars(hist_items)}
</body></html>
"""


def write_report(out_path: str, report_path: str) -> None:
    statuses, exec_s = load(out_path)
    with open(report_path, "w", encoding="utf-8") as f:
        f.write(render(statuses, exec_s, f"codepool replay: {out_path}"))
