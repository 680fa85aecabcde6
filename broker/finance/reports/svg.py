"""Hand-built SVG charts for the HTML report: no scripts, no external assets, deterministic output. Each chart
has a y axis in dollars with gridlines, a tooltip (`<title>`) on every bar segment, and, when there are few
bars, each bar's total written above it (amounts rounded by `broker.finance.money`)."""

from __future__ import annotations

from decimal import Decimal
from html import escape

from broker.finance.money import usd

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22")
W, H, LEFT, BOTTOM, TOP = 760, 300, 70, 60, 30


def _nice_max(v: float) -> float:
    if v <= 0:
        return 1.0
    step = 10 ** len(str(int(v))) / 10
    for m in (1, 2, 2.5, 5, 10):
        if v <= step * m:
            return step * m
    return v


def axis_label(value: float, top: float) -> str:
    """A y-axis tick: whole dollars, or cents when the axis tops out under $10."""
    return f"${value:,.2f}" if top < 10 else f"${value:,.0f}"


def stacked_bars(
    title: str, labels: list[str], series: dict[str, list[Decimal]], *, chart_id: str, totals_above: bool = True
) -> str:
    """Stacked vertical bars: one bar per label, one colour per series, with a legend; `totals_above`: write each
    bar's total above it (when there are at most 12 bars)."""
    totals = [sum((s[i] for s in series.values()), Decimal("0")) for i in range(len(labels))]
    top = _nice_max(float(max(totals, default=Decimal("0"))))
    plot_w, plot_h = W - LEFT - 20, H - BOTTOM - TOP
    n = max(len(labels), 1)
    bar_w = plot_w / n * 0.8
    parts = [
        f'<svg id="{chart_id}" class="chart" role="img" width="{W}" '
        f'height="{H + 20 * ((len(series) + 3) // 4)}" viewBox="0 0 {W} {H + 20 * ((len(series) + 3) // 4)}">',
        f"<title>{escape(title)}</title>",
        f'<text x="{LEFT}" y="18" font-size="14" font-weight="bold">{escape(title)}</text>',
    ]
    for k in range(5):
        y = TOP + plot_h - plot_h * k / 4
        parts.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{W - 20}" y2="{y:.1f}" stroke="#ddd"/>')
        parts.append(
            f'<text class="axis" x="{LEFT - 6}" y="{y + 4:.1f}" font-size="10" text-anchor="end">'
            f"{axis_label(top * k / 4, top)}</text>"
        )
    for i, lab in enumerate(labels):
        x = LEFT + plot_w * i / n + (plot_w / n - bar_w) / 2
        y = TOP + plot_h
        for j, (name, values) in enumerate(series.items()):
            h = plot_h * float(values[i]) / top if values[i] > 0 else 0.0
            if h <= 0:
                continue
            y -= h
            parts.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar_w:.1f}" height="{h:.1f}" '
                f'fill="{PALETTE[j % len(PALETTE)]}"><title>{escape(name)} {escape(lab)}: '
                f"{usd(values[i])}</title></rect>"
            )
        if totals_above and n <= 12 and totals[i] > 0:
            parts.append(
                f'<text class="value" x="{x + bar_w / 2:.1f}" y="{y - 4:.1f}" font-size="10" '
                f'text-anchor="middle">{usd(totals[i])}</text>'
            )
        if n <= 12 or i % max(1, n // 10) == 0:
            parts.append(
                f'<text x="{x + bar_w / 2:.1f}" y="{TOP + plot_h + 14}" font-size="9" '
                f'text-anchor="middle">{escape(lab[-5:] if len(lab) == 10 else lab)}</text>'
            )
    for j, name in enumerate(series):
        lx, ly = LEFT + (j % 4) * 170, H - 20 + 20 * (j // 4)
        parts.append(f'<rect x="{lx}" y="{ly - 9}" width="10" height="10" fill="{PALETTE[j % len(PALETTE)]}"/>')
        parts.append(f'<text x="{lx + 14}" y="{ly}" font-size="11">{escape(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)
