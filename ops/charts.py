"""Inline SVG charts for the HTML report: horizontal bars for categories, a histogram
with axes for run times. No plotting library.

Every size is computed from what is drawn: text is monospace, so a label's width is its
length times one advance, and the margins are made from the longest label and the
largest number. Nothing is clipped, whatever the labels, the counts or how many
categories there are; the SVG scales down (never crops) when the page is narrower.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

FONT_PX = 12
# DejaVu Sans Mono's advance is 0.602 em; others are close. Rounded up for safety.
ADVANCE_PX = 0.64 * FONT_PX
MAX_LABEL_CHARS = 72  # longer labels are shortened with "…" (the full text is the title)
MAX_ROWS = 25  # bars drawn; the rest are summed in a line under the chart
ROW_PX = 22
PLOT_PX = 520  # the length of the value axis
COLUMN_PX = 34  # the width of one histogram column
PLOT_HEIGHT_PX = 240
PAD_PX = 8
STYLE = f'font-family="monospace" font-size="{FONT_PX}"'


def text_px(text: str) -> float:
    """The drawn width of ``text`` (pixels)."""
    return len(text) * ADVANCE_PX


def shorten(label: str, limit: int = MAX_LABEL_CHARS) -> str:
    return label if len(label) <= limit else label[: limit - 1] + "…"


def nice_ticks(peak: float, count: int = 5) -> list[float]:
    """Round axis ticks from 0 to at least ``peak``: steps of 1, 2 or 5 times 10^k."""
    if peak <= 0:
        return [0.0, 1.0]
    raw = peak / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    step = max(step, 1.0)  # counts: never a fractional tick
    top = math.ceil(peak / step) * step
    return [k * step for k in range(round(top / step) + 1)]


def number(value: float) -> str:
    return f"{value:,.0f}"


def bar_chart(items: Sequence[tuple[str, int, str]], *, value_title: str = "calls") -> str:
    """Horizontal bars, one row per ``(label, count, color)``, labels on the left."""
    rows = list(items[:MAX_ROWS])
    if not rows:
        return "<p>(nothing to chart)</p>"
    ticks = nice_ticks(max(count for _, count, _ in rows))
    labels = [shorten(label) for label, _, _ in rows]
    left = max(text_px(label) for label in labels) + 2 * PAD_PX
    right = max(text_px(number(count)) for _, count, _ in rows) + 2 * PAD_PX
    right = max(right, text_px(number(ticks[-1])) / 2 + PAD_PX)  # the last tick's label
    top = PAD_PX
    plot_h = ROW_PX * len(rows)
    width = left + PLOT_PX + right
    height = top + plot_h + FONT_PX * 3 + 3 * PAD_PX  # tick labels, then the axis title

    def x(value: float) -> float:
        return left + PLOT_PX * value / ticks[-1]

    parts = [_svg_open(width, height)]
    for tick in ticks:
        parts.append(_line(x(tick), top, x(tick), top + plot_h, "#ddd"))
        parts.append(_text(x(tick), top + plot_h + PAD_PX + FONT_PX, number(tick), "middle"))
    for i, ((label, count, color), shown) in enumerate(zip(rows, labels, strict=True)):
        y = top + i * ROW_PX
        middle = y + ROW_PX / 2 + FONT_PX / 3
        parts.append(
            f'<rect x="{left:.1f}" y="{y + 3:.1f}" width="{x(count) - left:.1f}" '
            f'height="{ROW_PX - 6}" fill="{color}"><title>{html.escape(label)}: '
            f"{number(count)}</title></rect>"
        )
        parts.append(_text(left - PAD_PX, middle, shown, "end", title=label))
        parts.append(_text(x(count) + 4, middle, number(count), "start"))
    parts.append(_line(left, top, left, top + plot_h, "#333"))
    parts.append(_line(left, top + plot_h, left + PLOT_PX, top + plot_h, "#333"))
    parts.append(_text(left + PLOT_PX / 2, height - PAD_PX, value_title, "middle"))
    parts.append("</svg>")
    rest = items[MAX_ROWS:]
    if rest:
        calls = number(sum(count for _, count, _ in rest))
        parts.append(f"<p>{len(rest)} more, {calls} {html.escape(value_title)}: see the table.</p>")
    return "\n".join(parts)


def column_chart(
    items: Sequence[tuple[str, int]], *, color: str, x_title: str, y_title: str
) -> str:
    """Vertical columns with a count axis: a histogram of ``(bucket label, count)``."""
    if not items:
        return "<p>(nothing to chart)</p>"
    ticks = nice_ticks(max(count for _, count in items))
    tick_w = max(text_px(number(tick)) for tick in ticks)
    # Bucket labels are drawn at 45 degrees, ending under their column: each reaches its
    # width / sqrt(2) down and as far left.
    drop = max(text_px(label) for label, _ in items) / math.sqrt(2)
    left = max(3 * PAD_PX + FONT_PX + tick_w, drop - COLUMN_PX / 2 + PAD_PX)
    top = FONT_PX + 2 * PAD_PX  # room for the count over the tallest column
    plot_h = max(PLOT_HEIGHT_PX, text_px(y_title) + 2 * PAD_PX)
    plot_w = COLUMN_PX * len(items)
    base = top + plot_h + PAD_PX + FONT_PX / 2  # where each bucket label ends
    height = base + drop + 2 * FONT_PX + 3 * PAD_PX
    title_x = max(left + plot_w / 2, text_px(x_title) / 2 + PAD_PX)
    width = max(left + plot_w + 2 * PAD_PX, title_x + text_px(x_title) / 2 + PAD_PX)

    def y(value: float) -> float:
        return top + plot_h * (1 - value / ticks[-1])

    parts = [_svg_open(width, height)]
    for tick in ticks:
        parts.append(_line(left, y(tick), left + plot_w, y(tick), "#ddd"))
        parts.append(_text(left - PAD_PX, y(tick) + FONT_PX / 3, number(tick), "end"))
    for i, (label, count) in enumerate(items):
        x = left + i * COLUMN_PX
        parts.append(
            f'<rect x="{x + 3:.1f}" y="{y(count):.1f}" width="{COLUMN_PX - 6}" '
            f'height="{y(0) - y(count):.1f}" fill="{color}"><title>{html.escape(label)}: '
            f"{number(count)}</title></rect>"
        )
        center = x + COLUMN_PX / 2
        if count and text_px(number(count)) <= COLUMN_PX:
            parts.append(_text(center, y(count) - 4, number(count), "middle"))
        parts.append(
            f'<text x="{center:.1f}" y="{base:.1f}" {STYLE} text-anchor="end" '
            f'transform="rotate(-45 {center:.1f} {base:.1f})">{html.escape(label)}</text>'
        )
    parts.append(_line(left, top, left, y(0), "#333"))
    parts.append(_line(left, y(0), left + plot_w, y(0), "#333"))
    parts.append(_text(title_x, height - PAD_PX, x_title, "middle"))
    middle = top + plot_h / 2
    parts.append(
        f'<text x="{PAD_PX + FONT_PX:.1f}" y="{middle:.1f}" {STYLE} text-anchor="middle" '
        f'transform="rotate(-90 {PAD_PX + FONT_PX:.1f} {middle:.1f})">{html.escape(y_title)}'
        "</text>"
    )
    parts.append("</svg>")
    return "\n".join(parts)


def _svg_open(width: float, height: float) -> str:
    return (
        f'<svg class="chart" width="{math.ceil(width)}" height="{math.ceil(height)}" '
        f'viewBox="0 0 {math.ceil(width)} {math.ceil(height)}" '
        'xmlns="http://www.w3.org/2000/svg">'
    )


def _line(x1: float, y1: float, x2: float, y2: float, color: str) -> str:
    return (
        f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" '
        f'stroke="{color}" stroke-width="1"/>'
    )


def _text(x: float, y: float, text: str, anchor: str, *, title: str = "") -> str:
    tip = f"<title>{html.escape(title)}</title>" if title and title != text else ""
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" {STYLE} text-anchor="{anchor}">{tip}'
        f"{html.escape(text)}</text>"
    )
