"""PDF report (reportlab): summary, the same four charts as the HTML report drawn as vector graphics, and the
breakdown tables. Built with reportlab's `invariant` mode and fixed metadata, so the same period gives the same
bytes."""

from __future__ import annotations

import io
from decimal import Decimal

from reportlab.graphics.charts.barcharts import VerticalBarChart
from reportlab.graphics.charts.legends import Legend
from reportlab.graphics.shapes import Drawing, String
from reportlab.lib import colors
from reportlab.lib.pagesizes import A4
from reportlab.lib.styles import getSampleStyleSheet
from reportlab.lib.units import mm
from reportlab.platypus import PageBreak, Paragraph, SimpleDocTemplate, Spacer, Table, TableStyle

from broker.finance.costs import Grouped
from broker.finance.reports.data import ReportData
from broker.finance.reports.svg import PALETTE

CHART_W, CHART_H = 170 * mm, 70 * mm


def _usd(d: Decimal) -> str:
    return f"${d.quantize(Decimal('0.01')):,}"


def _chart(title: str, labels: list[str], series: dict[str, list[Decimal]]) -> Drawing:
    d = Drawing(CHART_W, CHART_H + 12 * mm)
    d.add(String(0, CHART_H + 8 * mm, title, fontName="Helvetica-Bold", fontSize=10))
    if not labels or not any(series.values()):  # nothing to draw (reportlab cannot scale an empty chart)
        d.add(String(15 * mm, CHART_H / 2, "no spend in this period", fontName="Helvetica", fontSize=9))
        return d
    chart = VerticalBarChart()
    chart.x, chart.y, chart.width, chart.height = 15 * mm, 12 * mm, CHART_W - 20 * mm, CHART_H - 14 * mm
    names = list(series) or ["cost"]
    chart.data = [[float(v) for v in series[n]] for n in names] if series else [[0.0] * max(len(labels), 1)]
    chart.categoryAxis.style = "stacked"
    chart.categoryAxis.categoryNames = [lab[-5:] if len(lab) == 10 else lab for lab in labels] or [""]
    chart.categoryAxis.labels.fontSize = 6
    chart.categoryAxis.labels.angle = 45 if len(labels) > 10 else 0
    chart.categoryAxis.labels.boxAnchor = "ne" if len(labels) > 10 else "n"
    chart.valueAxis.valueMin = 0
    chart.valueAxis.labels.fontSize = 7
    chart.valueAxis.labelTextFormat = "$%0.0f"
    for i in range(len(names)):
        chart.bars[i].fillColor = colors.HexColor(PALETTE[i % len(PALETTE)])
        chart.bars[i].strokeColor = None
    d.add(chart)
    legend = Legend()
    legend.x, legend.y = 15 * mm, 4 * mm
    legend.fontSize = 7
    legend.columnMaximum = 1
    legend.alignment = "right"
    legend.colorNamePairs = [(colors.HexColor(PALETTE[i % len(PALETTE)]), n) for i, n in enumerate(names[:8])]
    d.add(legend)
    return d


def _table(grouped: Grouped) -> Table:
    rows = [[", ".join(grouped.group_by), "cost", "on-demand", "savings", "entries"]]
    rows += [
        [" / ".join(k), _usd(s.cost_usd), _usd(s.on_demand_usd), _usd(s.savings_usd), str(s.entries)]
        for k, s in grouped.sorted_rows()
    ]
    table = Table(rows, hAlign="LEFT")
    table.setStyle(
        TableStyle(
            [
                ("FONTSIZE", (0, 0), (-1, -1), 8),
                ("GRID", (0, 0), (-1, -1), 0.25, colors.grey),
                ("BACKGROUND", (0, 0), (-1, 0), colors.HexColor("#eeeeee")),
                ("ALIGN", (1, 0), (-1, -1), "RIGHT"),
            ]
        )
    )
    return table


def render_pdf(data: ReportData) -> bytes:
    styles = getSampleStyleSheet()
    buf = io.BytesIO()
    title = f"GPU training costs: {data.tenant}, {data.label}"
    doc = SimpleDocTemplate(
        buf,
        pagesize=A4,
        title=title,
        author="overspill",
        creator="overspill",
        subject="cost report",
        invariant=1,
        leftMargin=15 * mm,
        rightMargin=15 * mm,
        topMargin=15 * mm,
        bottomMargin=15 * mm,
    )
    t = data.total
    wasted = data.wasted_by_team()
    providers = [(k[0], s) for k, s in data.by_provider.sorted_rows()]
    story = [
        Paragraph(title, styles["Title"]),
        Paragraph(
            f"Period {data.start:%Y-%m-%d %H:%M} to {data.end:%Y-%m-%d %H:%M} UTC (end exclusive); "
            f"{len(data.entries)} ledger entries. Total cost {_usd(t.cost_usd)}, on-demand equivalent "
            f"{_usd(t.on_demand_usd)}, saved by spot {_usd(t.savings_usd)}, lost to preemptions "
            f"{_usd(sum((w for _, _, w in wasted), Decimal('0')))}.",
            styles["Normal"],
        ),
        Spacer(1, 4 * mm),
        _chart("Spend per day by team", data.days, data.series(data.by_day_team)),
        _chart("Spend per day by provider", data.days, data.series(data.by_day_provider)),
        PageBreak(),
        _chart(
            "Spot savings against on-demand, by provider",
            [p for p, _ in providers],
            {
                "cost": [s.cost_usd for _, s in providers],
                "saved vs on-demand": [max(Decimal("0"), s.savings_usd) for _, s in providers],
            },
        ),
        _chart(
            "Preemption overhead, by team",
            [w[0] for w in wasted],
            {"useful compute": [w[1] for w in wasted], "wasted by preemptions": [w[2] for w in wasted]},
        ),
        _chart(
            "On-prem vs cloud",
            ["on-prem", "cloud"],
            {"cost": [data.by_location["on-prem"].cost_usd, data.by_location["cloud"].cost_usd]},
        ),
        PageBreak(),
        Paragraph("By team", styles["Heading2"]),
        _table(data.by_team),
        Paragraph("By project", styles["Heading2"]),
        _table(data.by_project),
        Paragraph("By provider", styles["Heading2"]),
        _table(data.by_provider),
        Paragraph("By kind", styles["Heading2"]),
        _table(data.by_kind),
    ]
    doc.build(story)
    return buf.getvalue()
