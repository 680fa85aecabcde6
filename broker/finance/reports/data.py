"""The numbers every report format shows, computed once from a period's ledger entries.

Nothing here reads a clock: a report of the same period over the same ledger is the same report.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from sqlalchemy.engine import Engine

from broker.finance.costs import Entry, Grouped, Sums, entries, group, iter_days
from broker.finance.reports.period import label

ZERO = Decimal("0")


@dataclass
class ReportData:
    tenant: str
    start: datetime
    end: datetime
    entries: list[Entry]
    days: list[str]
    total: Sums
    by_team: Grouped
    by_project: Grouped
    by_provider: Grouped
    by_kind: Grouped
    by_day_team: Grouped
    by_day_provider: Grouped
    by_team_kind: Grouped
    by_location: dict[str, Sums]  # "on-prem" / "cloud"
    top_jobs: list[tuple[str, str, str, Sums]]  # (job id, team, project, sums), costliest first

    @property
    def label(self) -> str:
        return label(self.start, self.end)

    def series(self, grouped: Grouped) -> dict[str, list[Decimal]]:
        """A (day, name) grouping as one list of daily costs per name, names sorted, days in order."""
        index = {d: i for i, d in enumerate(self.days)}
        out: dict[str, list[Decimal]] = {}
        for (day, name), sums in grouped.sorted_rows():
            out.setdefault(name, [ZERO] * len(self.days))[index[day]] += sums.cost_usd
        return dict(sorted(out.items()))

    def wasted_by_team(self) -> list[tuple[str, Decimal, Decimal]]:
        """(team, compute usd, wasted usd) for every team, sorted by team."""
        teams: dict[str, list[Decimal]] = {}
        for (team, kind), sums in self.by_team_kind.rows.items():
            slot = teams.setdefault(team, [ZERO, ZERO])
            if kind == "wasted":
                slot[1] += sums.cost_usd
            elif kind == "compute":
                slot[0] += sums.cost_usd
        return [(t, v[0], v[1]) for t, v in sorted(teams.items())]


def build(items: list[Entry], tenant: str, start: datetime, end: datetime) -> ReportData:
    def location(e: Entry) -> str:
        return "on-prem" if e.capacity_type == "on_prem" else "cloud"

    by_location: dict[str, Sums] = {"cloud": Sums(), "on-prem": Sums()}
    jobs: dict[str, tuple[str, str, Sums]] = {}
    for e in items:
        by_location[location(e)].add(e)
        slot = jobs.get(e.job_id)
        if slot is None:
            slot = jobs[e.job_id] = (e.team, e.project, Sums())
        slot[2].add(e)
    top = sorted(((j, t, p, s) for j, (t, p, s) in jobs.items()), key=lambda r: (-r[3].cost_usd, r[0]))[:20]
    return ReportData(
        tenant=tenant,
        start=start,
        end=end,
        entries=items,
        days=list(iter_days(start, end)),
        total=group(items, ()).total,
        by_team=group(items, ("team",)),
        by_project=group(items, ("project",)),
        by_provider=group(items, ("provider",)),
        by_kind=group(items, ("kind",)),
        by_day_team=group(items, ("day", "team")),
        by_day_provider=group(items, ("day", "provider")),
        by_team_kind=group(items, ("team", "kind")),
        by_location=by_location,
        top_jobs=top,
    )


def load(engine: Engine, tenant: str, start: datetime, end: datetime) -> ReportData:
    return build(entries(engine, tenant, start, end), tenant, start, end)


Progress = Callable[[str], None]
