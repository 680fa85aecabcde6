"""PDF report (reportlab): summary, the same charts as the HTML report drawn as vector graphics (a y axis in
dollars), and the same tables (`tables`), each ending in a bold totals row. Every page's footer says the period,
the data's "as of" time and "Page N of M" (the canvas holds the pages until it knows how many there are). Built
with reportlab's `invariant` mode and fixed metadata, so the same period over the same ledger gives the same
bytes."""

from __future__ import annotations

import io
from decimal import Decimal
from functools import partial
from typing import Any
from xml.sax.saxutils import escape

from reportlab.graphics.charts.barcharts import VerticalBarChart
from reportlab.graphics.charts.legends import Legend
from reportlab.graphics.shapes import Drawing, String
from reportlab.lib import colors
from reportlab.lib.pagesizes import A4
from reportlab.lib.styles import getSampleStyleSheet
from reportlab.lib.units import mm
from reportlab.pdfgen.canvas import Canvas
from reportlab.platypus import PageBreak, Paragraph, SimpleDocTemplate, Spacer, Table, TableStyle

from broker.finance.reports.data import ReportData
from broker.finance.reports.svg import PALETTE, axis_label
from broker.finance.reports.tables import NOTE, TableSpec, counted, report_tables, summary

CHART_W, CHART_H = 170 * mm, 70 * mm


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
    top = max((sum((float(v[i]) for v in chart.data), 0.0) for i in range(len(labels))), default=0.0)
    chart.valueAxis.labelTextFormat = lambda v: axis_label(v, top)
    chart.valueAxis.visibleGrid = True
    chart.valueAxis.gridStrokeColor = colors.HexColor("#dddddd")
    chart.valueAxis.gridStrokeWidth = 0.25
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


class _NumberedCanvas(Canvas):
    """A canvas that holds its pages until the end, then stamps each with "Page N of M" and the footer text."""

    def __init__(self, *args: Any, footer: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._footer = footer
        self._pages: list[dict[str, Any]] = []

    def showPage(self) -> None:  # reportlab's name
        self._pages.append(dict(self.__dict__))
        self._startPage()

    def save(self) -> None:
        count = len(self._pages)
        for number, page in enumerate(self._pages, start=1):
            self.__dict__.update(page)
            width, _ = self._pagesize
            self.setFont("Helvetica", 7)
            self.setFillColor(colors.HexColor("#555555"))
            self.drawString(15 * mm, 8 * mm, self._footer)
            self.drawRightString(width - 15 * mm, 8 * mm, f"Page {number} of {count}")
            super().showPage()
        super().save()


def _table(spec: TableSpec, styles: Any) -> Table:
    cell = styles["BodyText"].clone("cell", fontSize=7, leading=8)
    body = [[Paragraph(escape(v), cell) if i < spec.numeric_from else v for i, v in enumerate(r)] for r in spec.rows]
    rows = [spec.header, *body, spec.total]
    widths = None
    if len(spec.header) == 7:  # the costliest jobs: room for where each ran
        widths = [30 * mm, 24 * mm, 16 * mm, 16 * mm, 52 * mm, 21 * mm, 21 * mm]
    table = Table(rows, hAlign="LEFT", colWidths=widths, repeatRows=1)
    table.setStyle(
        TableStyle(
            [
                ("FONTSIZE", (0, 0), (-1, -1), 7),
                ("GRID", (0, 0), (-1, -1), 0.25, colors.grey),
                ("BACKGROUND", (0, 0), (-1, 0), colors.HexColor("#eeeeee")),
                ("ALIGN", (spec.numeric_from, 0), (-1, -1), "RIGHT"),
                ("VALIGN", (0, 0), (-1, -1), "TOP"),
                ("FONTNAME", (0, -1), (-1, -1), "Helvetica-Bold"),
                ("BACKGROUND", (0, -1), (-1, -1), colors.HexColor("#f3f3f3")),
                ("LINEABOVE", (0, -1), (-1, -1), 1, colors.black),
            ]
        )
    )
    return table


def render_pdf(data: ReportData) -> bytes:
    styles = getSampleStyleSheet()
    buf = io.BytesIO()
    title = f"GPU training costs: {data.tenant}, {data.title}"
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
    k = summary(data)
    wasted = data.wasted_by_team()
    providers = [(key[0], s) for key, s in data.by_provider.sorted_rows()]
    still = " The period is still running: the figures stop at the ledger's latest accrued entry." if data.open else ""
    story: list[Any] = [
        Paragraph(escape(title), styles["Title"]),
        Paragraph(
            escape(
                f"Period {data.start:%Y-%m-%d %H:%M} to {data.end:%Y-%m-%d %H:%M} UTC (end exclusive); "
                f"{data.as_of_text}. {counted(len(data.entries), 'ledger entry', 'ledger entries')}, "
                f"{counted(data.job_count, 'job')}.{still}"
            ),
            styles["Normal"],
        ),
        Paragraph(
            escape(
                f"Total cost {k['cost']}, on-demand equivalent {k['on_demand']}, saved by spot {k['saved']}, "
                f"lost to preemptions {k['lost']}, net saving {k['net']}."
            ),
            styles["Normal"],
        ),
        Spacer(1, 4 * mm),
        _chart("Spend per day by team", data.days, data.series(data.by_day_team)),
        _chart("Spend per day by provider", data.days, data.series(data.by_day_provider)),
        PageBreak(),
        _chart(
            "Spot savings against on-demand (useful work), by provider",
            [p for p, _ in providers],
            {
                "cost": [s.cost_usd for _, s in providers],
                "saved by spot": [max(Decimal("0"), s.savings_usd) for _, s in providers],
            },
        ),
        _chart(
            "Preemption overhead, by team",
            [w[0] for w in wasted],
            {"useful compute": [w[1] for w in wasted], "lost to preemptions": [w[2] for w in wasted]},
        ),
        _chart(
            "On-prem vs cloud",
            ["on-prem", "cloud"],
            {"cost": [data.by_location["on-prem"].cost_usd, data.by_location["cloud"].cost_usd]},
        ),
        PageBreak(),
    ]
    for spec in report_tables(data):
        story += [Paragraph(escape(spec.title), styles["Heading2"]), _table(spec, styles)]
    story.append(Paragraph(escape(NOTE), styles["Italic"]))
    footer = f"Overspill costs {data.tenant}, {data.title}: {data.as_of_text}"
    doc.build(story, canvasmaker=partial(_NumberedCanvas, footer=footer))
    return buf.getvalue()
