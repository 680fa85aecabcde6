"""The tables of the HTML and PDF reports, built once as text so both formats show the same figures.

Every table ends with a totals row. Money is rounded by the one display rule (`broker.finance.money` through
`broker.finance.costs.shown`): each column allocated so that its lines add up exactly to its total, which is the
rounded exact total. The costliest-jobs table lists the top jobs and one line for all the others, so it too adds
up to the period's total.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from broker.finance.costs import Grouped, Sums, shown
from broker.finance.money import allocate, usd
from broker.finance.reports.data import ReportData

MONEY_HEADER = ["cost", "lost to preemptions", "on-demand equivalent", "saved by spot", "entries"]


@dataclass
class TableSpec:
    """A titled table of text cells: `header`, body `rows`, one `total` row; columns from `numeric_from` on are
    figures (right-aligned)."""

    title: str
    header: list[str]
    rows: list[list[str]]
    total: list[str]
    numeric_from: int


def _money_table(title: str, key: str, lines: list[tuple[str, Sums]], total: Sums) -> TableSpec:
    shown_lines, footer = shown([s for _, s in lines])
    rows = [
        [name, usd(r.cost_usd), usd(r.wasted_usd), usd(r.on_demand_usd), usd(r.savings_usd), str(s.entries)]
        for (name, s), r in zip(lines, shown_lines, strict=True)
    ]
    foot = [
        "Total",
        usd(footer.cost_usd),
        usd(footer.wasted_usd),
        usd(footer.on_demand_usd),
        usd(footer.savings_usd),
        str(total.entries),
    ]
    return TableSpec(title, [key, *MONEY_HEADER], rows, foot, 1)


def by_kind(data: ReportData) -> TableSpec:
    """Cost and saving per ledger kind (a `wasted` line is the compute lost to preemptions: no saving)."""
    ordered = data.by_kind.sorted_rows()
    lines, footer = shown([s for _, s in ordered])
    rows = [
        [k[0], usd(r.cost_usd), usd(r.savings_usd), str(s.entries)] for (k, s), r in zip(ordered, lines, strict=True)
    ]
    total = ["Total", usd(footer.cost_usd), usd(footer.savings_usd), str(data.total.entries)]
    return TableSpec("By kind", ["kind", "cost", "saved by spot", "entries"], rows, total, 1)


def _grouped(title: str, grouped: Grouped) -> TableSpec:
    lines = [(" / ".join(k) or "all", s) for k, s in grouped.sorted_rows()]
    return _money_table(title, ", ".join(grouped.group_by), lines, grouped.total)


def counted(n: int, noun: str, nouns: str | None = None) -> str:
    """`n` with its noun, singular for exactly one: "1 job", "6 jobs", "1 ledger entry"."""
    return f"{n} {noun if n == 1 else nouns or noun + 's'}"


def costliest_jobs(data: ReportData) -> TableSpec:
    """The top jobs with their name, team, project and where they ran, then every other job as one line."""
    lines: list[Sums] = [j.sums for j in data.top_jobs]
    others = len(data.top_jobs) < data.job_count
    if others:
        lines.append(data.other_jobs)
    shown_lines, footer = shown(lines)
    rows = [
        [j.job_id, j.name, j.team, j.project, j.where(), usd(r.cost_usd), usd(r.savings_usd)]
        for j, r in zip(data.top_jobs, shown_lines, strict=False)
    ]
    if others:
        r = shown_lines[-1]
        rest = data.job_count - len(data.top_jobs)
        name = f"{rest} other job{'s' if rest != 1 else ''}"
        rows.append([name, "", "", "", "", usd(r.cost_usd), usd(r.savings_usd)])
    total = [
        f"Total ({counted(data.job_count, 'job')})",
        "",
        "",
        "",
        "",
        usd(footer.cost_usd),
        usd(footer.savings_usd),
    ]
    header = ["job", "name", "team", "project", "where it ran", "cost", "saved by spot"]
    return TableSpec("Costliest jobs", header, rows, total, 5)


def preemptions(data: ReportData) -> TableSpec:
    """Per team: compute that did useful work, compute lost to preemptions, and the lost share."""
    teams = data.wasted_by_team()
    useful = allocate([u for _, u, _ in teams])
    lost = allocate([w for _, _, w in teams])

    def share(u: Decimal, w: Decimal) -> str:
        return f"{(w / (u + w) * 100).quantize(Decimal('0.1'))}%" if u + w > 0 else "-"

    rows = [[t, usd(u), usd(w), share(u0, w0)] for (t, u0, w0), u, w in zip(teams, useful, lost, strict=True)]
    total_u = sum((u for _, u, _ in teams), Decimal(0))
    total_w = sum((w for _, _, w in teams), Decimal(0))
    total = ["Total", usd(sum(useful, Decimal(0))), usd(sum(lost, Decimal(0))), share(total_u, total_w)]
    header = ["team", "useful compute", "lost to preemptions", "lost share"]
    return TableSpec("Compute lost to preemptions, by team", header, rows, total, 1)


def report_tables(data: ReportData) -> list[TableSpec]:
    """Every table of the report, in order."""
    location = [(k, data.by_location[k]) for k in ("on-prem", "cloud")]
    return [
        _grouped("By team", data.by_team),
        _grouped("By project", data.by_project),
        _grouped("By provider", data.by_provider),
        by_kind(data),
        _money_table("On-prem vs cloud", "where", location, data.total),
        costliest_jobs(data),
        preemptions(data),
    ]


def summary(data: ReportData) -> dict[str, str]:
    """The headline figures, rounded like the tables' totals: cost, on-demand equivalent, saved by spot, lost
    to preemptions, and net (saved - lost = on-demand equivalent - cost)."""
    _, t = shown([data.total])
    return {
        "cost": usd(t.cost_usd),
        "on_demand": usd(t.on_demand_usd),
        "saved": usd(t.savings_usd),
        "lost": usd(t.wasted_usd),
        "net": usd(t.on_demand_usd - t.cost_usd),
    }


NOTE = (
    "Amounts are rounded to cents (half-even); in every column the lines add up to the total, which is the exact "
    "total rounded (largest-remainder allocation). Saved by spot is the on-demand equivalent of the useful work "
    "minus what it cost; compute lost to preemptions is a loss, shown apart, never a saving "
    "(net saving = saved - lost). The FOCUS export carries the exact amounts."
)
