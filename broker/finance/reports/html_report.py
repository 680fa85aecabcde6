"""HTML report: one self-contained page (inline CSS and SVG, no scripts, no external assets) with charts of spend
over time by team and by provider, spot savings against on-demand, preemption overhead and on-prem vs cloud,
and the tables behind them."""

from __future__ import annotations

from decimal import Decimal
from html import escape

from broker.finance.costs import Grouped, Sums, money
from broker.finance.reports.data import ReportData
from broker.finance.reports.svg import stacked_bars

_CSS = (
    "body{font-family:system-ui,sans-serif;margin:24px;color:#222}table{border-collapse:collapse;margin:8px 0 24px}"
    "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}td:first-child,th:first-child{text-align:left}"
    "h2{margin-top:32px}.kpi{display:inline-block;margin-right:32px}.kpi b{font-size:20px;display:block}"
)


def _usd(d: Decimal) -> str:
    return f"${d.quantize(Decimal('0.01')):,}"


def _table(title: str, grouped: Grouped) -> str:
    rows = "".join(
        f"<tr><td>{escape(' / '.join(k) or 'all')}</td><td>{_usd(s.cost_usd)}</td><td>{_usd(s.on_demand_usd)}</td>"
        f"<td>{_usd(s.savings_usd)}</td><td>{s.entries}</td></tr>"
        for k, s in grouped.sorted_rows()
    )
    head = "<tr><th>{}</th><th>cost</th><th>on-demand</th><th>savings</th><th>entries</th></tr>".format(
        escape(", ".join(grouped.group_by))
    )
    return f"<h3>{escape(title)}</h3><table>{head}{rows}</table>"


def _pairs(labels: list[str], items: list[tuple[str, Sums]]) -> dict[str, list[Decimal]]:
    return {
        "cost": [s.cost_usd for _, s in items],
        "saved vs on-demand": [max(Decimal("0"), s.savings_usd) for _, s in items],
    }


def render_html(data: ReportData) -> bytes:
    t = data.total
    providers = [(k[0], s) for k, s in data.by_provider.sorted_rows()]
    wasted = data.wasted_by_team()
    wasted_total = sum((w for _, _, w in wasted), Decimal("0"))
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
            "Spot savings against on-demand, by provider",
            [p for p, _ in providers],
            _pairs([p for p, _ in providers], providers),
            chart_id="chart-savings",
        ),
        stacked_bars(
            "Preemption overhead (work lost since the last checkpoint), by team",
            [w[0] for w in wasted],
            {"useful compute": [w[1] for w in wasted], "wasted by preemptions": [w[2] for w in wasted]},
            chart_id="chart-preemption",
        ),
        stacked_bars(
            "On-prem vs cloud",
            [k for k, _ in location],
            {"cost": [s.cost_usd for _, s in location]},
            chart_id="chart-onprem-cloud",
        ),
    ]
    jobs = "".join(
        f"<tr><td>{escape(j)}</td><td>{escape(team)}</td><td>{escape(project)}</td><td>{_usd(s.cost_usd)}</td>"
        f"<td>{_usd(s.savings_usd)}</td></tr>"
        for j, team, project, s in data.top_jobs
    )
    body = (
        f"<h1>GPU training costs: {escape(data.tenant)}, {escape(data.label)}</h1>"
        f"<p>Period {data.start:%Y-%m-%d %H:%M} to {data.end:%Y-%m-%d %H:%M} UTC (end exclusive). "
        f"{len(data.entries)} ledger entries.</p>"
        f'<div class="kpi">Total cost<b id="total-cost">{_usd(t.cost_usd)}</b></div>'
        f'<div class="kpi">On-demand equivalent<b>{_usd(t.on_demand_usd)}</b></div>'
        f'<div class="kpi">Saved by spot<b id="total-savings">{_usd(t.savings_usd)}</b></div>'
        f'<div class="kpi">Lost to preemptions<b>{_usd(wasted_total)}</b></div>'
        "<h2>Charts</h2>" + "".join(f"<figure>{c}</figure>" for c in charts) + "<h2>Breakdown</h2>"
        f"{_table('By team', data.by_team)}{_table('By project', data.by_project)}"
        f"{_table('By provider', data.by_provider)}{_table('By kind', data.by_kind)}"
        "<h3>Costliest jobs</h3><table><tr><th>job</th><th>team</th><th>project</th><th>cost</th><th>savings</th>"
        f"</tr>{jobs}</table>"
        f"<p>Exact total: {money(t.cost_usd)} USD.</p>"
    )
    page = (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><link rel="icon" href="data:,">'
        f"<title>Overspill costs {escape(data.tenant)} {escape(data.label)}</title>"
        f"<style>{_CSS}</style></head><body>{body}</body></html>\n"
    )
    return page.encode()
