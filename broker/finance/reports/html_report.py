"""HTML report: one self-contained page (inline CSS and SVG, no scripts, no external assets) with charts of spend
over time by team and by provider, spot savings against on-demand, preemption overhead and on-prem vs cloud,
and the tables behind them, each with a totals row. Amounts are rounded by the one display rule (`tables`)."""

from __future__ import annotations

from decimal import Decimal
from html import escape

from broker.finance.costs import Sums
from broker.finance.reports.data import ReportData
from broker.finance.reports.svg import stacked_bars
from broker.finance.reports.tables import NOTE, TableSpec, counted, report_tables, summary

_CSS = (
    "body{font-family:system-ui,sans-serif;margin:24px;color:#222}table{border-collapse:collapse;margin:8px 0 24px}"
    "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}td.text,th.text{text-align:left}"
    "tfoot td{font-weight:bold;background:#f3f3f3;border-top:2px solid #888}"
    "h2{margin-top:32px}.kpi{display:inline-block;margin-right:32px}.kpi b{font-size:20px;display:block}"
    ".note{color:#555;font-size:13px}"
)


def _table(spec: TableSpec) -> str:
    def cells(tag: str, values: list[str]) -> str:
        text = ' class="text"'
        return "".join(
            f"<{tag}{'' if i >= spec.numeric_from else text}>{escape(v)}</{tag}>" for i, v in enumerate(values)
        )

    body = "".join(f"<tr>{cells('td', r)}</tr>" for r in spec.rows)
    return (
        f"<h3>{escape(spec.title)}</h3><table><thead><tr>{cells('th', spec.header)}</tr></thead>"
        f"<tbody>{body}</tbody><tfoot><tr>{cells('td', spec.total)}</tr></tfoot></table>"
    )


def _pairs(items: list[tuple[str, Sums]]) -> dict[str, list[Decimal]]:
    return {
        "cost": [s.cost_usd for _, s in items],
        "saved by spot": [max(Decimal("0"), s.savings_usd) for _, s in items],
    }


def render_html(data: ReportData) -> bytes:
    providers = [(k[0], s) for k, s in data.by_provider.sorted_rows()]
    wasted = data.wasted_by_team()
    location = [(k, data.by_location[k]) for k in ("on-prem", "cloud")]
    charts = [
        stacked_bars("Spend per day by team", data.days, data.series(data.by_day_team), chart_id="chart-spend-by-team"),
        stacked_bars(
            "Spend per day by provider",
            data.days,
            data.series(data.by_day_provider),
            chart_id="chart-spend-by-provider",
        ),
        stacked_bars(
            "Spot savings against on-demand (useful work), by provider",
            [p for p, _ in providers],
            _pairs(providers),
            chart_id="chart-savings",
            totals_above=False,  # cost + saved is no figure of its own
        ),
        stacked_bars(
            "Preemption overhead (work lost since the last checkpoint), by team",
            [w[0] for w in wasted],
            {"useful compute": [w[1] for w in wasted], "lost to preemptions": [w[2] for w in wasted]},
            chart_id="chart-preemption",
        ),
        stacked_bars(
            "On-prem vs cloud",
            [k for k, _ in location],
            {"cost": [s.cost_usd for _, s in location]},
            chart_id="chart-onprem-cloud",
        ),
    ]
    k = summary(data)
    still = " The period is still running: the figures stop at the ledger's latest accrued entry." if data.open else ""
    body = (
        f"<h1>GPU training costs: {escape(data.tenant)}, {escape(data.title)}</h1>"
        f'<p id="period">Period {data.start:%Y-%m-%d %H:%M} to {data.end:%Y-%m-%d %H:%M} UTC (end exclusive); '
        f'<span id="as-of">{escape(data.as_of_text)}</span>. '
        f"{counted(len(data.entries), 'ledger entry', 'ledger entries')}, "
        f"{counted(data.job_count, 'job')}.{escape(still)}</p>"
        f'<div class="kpi">Total cost<b id="total-cost">{k["cost"]}</b></div>'
        f'<div class="kpi">On-demand equivalent<b id="total-on-demand">{k["on_demand"]}</b></div>'
        f'<div class="kpi">Saved by spot<b id="total-savings">{k["saved"]}</b></div>'
        f'<div class="kpi">Lost to preemptions<b id="total-wasted">{k["lost"]}</b></div>'
        f'<div class="kpi">Net saving<b id="total-net">{k["net"]}</b></div>'
        "<h2>Charts</h2>" + "".join(f"<figure>{c}</figure>" for c in charts) + "<h2>Breakdown</h2>"
        + "".join(_table(t) for t in report_tables(data))
        + f'<p class="note">{escape(NOTE)}</p>'
    )  # fmt: skip
    page = (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><link rel="icon" href="data:,">'
        f"<title>Overspill costs {escape(data.tenant)} {escape(data.title)}</title>"
        f"<style>{_CSS}</style></head><body>{body}</body></html>\n"
    )
    return page.encode()
