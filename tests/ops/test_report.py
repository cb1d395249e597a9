"""The replay report: charts whose text stays inside them, tallies from the output file."""

from __future__ import annotations

import html
import json
import math
import re
from pathlib import Path

from codepool.ops.charts import FONT_PX, bar_chart, column_chart
from codepool.ops.report import BUCKET_EDGES_S, bucket_label, load, render

# DejaVu Sans Mono, the monospace font the report is looked at with, advances 0.602 em.
ADVANCE_PX = 0.602 * FONT_PX
ASCENT_PX, DESCENT_PX = 0.8 * FONT_PX, 0.25 * FONT_PX
_SVG = re.compile(r'<svg class="chart" width="(\d+)" height="(\d+)"')
_TEXT = re.compile(
    r'<text x="(?P<x>[\d.-]+)" y="(?P<y>[\d.-]+)"[^>]*text-anchor="(?P<anchor>\w+)"'
    r'(?: transform="rotate\((?P<angle>-?\d+) [\d.-]+ [\d.-]+\)")?>(?:<title>.*?</title>)?'
    r"(?P<text>[^<]*)</text>"
)


def _overflows(svg: str) -> list[str]:
    """Text drawn (even partly) outside its SVG, by the font's real advance."""
    size = _SVG.search(svg)
    assert size is not None, svg[:200]
    width, height = float(size[1]), float(size[2])
    texts = list(_TEXT.finditer(svg))
    assert texts, "no text in the chart"
    outside = []
    for m in texts:
        x, y, length = float(m["x"]), float(m["y"]), len(html.unescape(m["text"]))
        run = length * ADVANCE_PX
        before = {"start": 0.0, "middle": run / 2, "end": run}[m["anchor"]]
        if m["angle"] is None:
            box = (x - before, y - ASCENT_PX, x - before + run, y + DESCENT_PX)
        elif m["angle"] == "-90":  # reads upwards
            box = (x - ASCENT_PX, y - run + before, x + DESCENT_PX, y + before)
        else:  # -45: reads up and to the right, ending at (x, y)
            assert m["angle"] == "-45" and m["anchor"] == "end"
            reach = run / math.sqrt(2)
            box = (x - reach - ASCENT_PX, y - ASCENT_PX, x + ASCENT_PX, y + reach)
        if box[0] < 0 or box[1] < 0 or box[2] > width or box[3] > height:
            outside.append(f"{m['text']!r} at {box} in {width}x{height}")
    return outside


def test_bar_chart_fits_long_labels_large_counts_and_many_categories() -> None:
    long_name = "package.submodule.deeply.nested.CustomValidationErrorWithALongName"
    items = [("a" * 200, 10_000_000, "#c00")]  # a count right at the last tick
    items += [(f"{long_name}{i}", 1000 - i, "#c00") for i in range(40)] + [("x", 1, "#c00")]
    svg = bar_chart(items, value_title="failed calls")
    assert _overflows(svg) == []
    assert svg.count("<rect") == 25  # the rest are summed under the chart
    rest = sum(count for _, count, _ in items[25:])
    assert f"17 more, {rest:,} failed calls: see the table." in svg
    assert "10,000,000" in svg and "a" * 71 + "…" in svg  # the 200-char name is shortened
    assert _overflows(bar_chart([("ok", 1, "#0a0")])) == []


def test_histogram_fits_its_bucket_labels_and_counts() -> None:
    every = [(bucket_label(edge), 10**k) for k, edge in enumerate(BUCKET_EDGES_S)]
    one = [(bucket_label(BUCKET_EDGES_S[0]), 3)]
    for items in (every, one, [("a bucket with a much longer label than usual", 7)]):
        svg = column_chart(
            items, color="#00c", x_title="run time (bucket upper edge)", y_title="calls"
        )
        assert _overflows(svg) == [], items
    assert [bucket_label(e) for e in BUCKET_EDGES_S[:3]] == ["≤0.5 ms", "≤1 ms", "≤2 ms"]
    assert bucket_label(BUCKET_EDGES_S[-1], last=True) == ">32.8 s"


def test_report_reads_old_and_new_output_lines(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    lines = [
        {"id": "a", "status": "ok", "exec_s": 0.002, "observation": "1\n"},
        {"id": "b", "status": "error", "exec_s": 0.003},  # before error types
        {"id": "c", "status": "error", "exec_s": 0.004, "error_type": "NameError"},
        {"id": "d", "status": "memory", "error_type": "MemoryError", "limit": "memory"},
        {"id": "e", "status": "timeout", "error_type": "timeout", "limit": "wall_time"},
        {"id": "f", "status": "ok", "error_type": None, "limit": None},
    ]
    out.write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"id": "g", "sta')
    data = load(str(out))
    assert data.statuses == {"ok": 2, "error": 2, "memory": 1, "timeout": 1}
    assert data.error_types == {"error": 1, "NameError": 1, "MemoryError": 1, "timeout": 1}
    assert data.limits == {"memory": 1, "wall_time": 1}
    assert not data.compared
    page = render(data, "t")
    assert "Observations compared" not in page and "<td>NameError</td>" in page
    assert "<h2>Limits reached</h2>" in page
    assert "<tr><td>wall_time</td><td>1</td><td>16.7%</td></tr>" in page
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    nothing = render(load(str(empty)), "t")
    assert "<p>No calls.</p>" in nothing and "<p>No call reached a limit.</p>" in nothing
