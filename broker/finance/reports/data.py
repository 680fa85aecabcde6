"""The numbers every report format shows, computed once from a period's ledger entries.

Nothing here reads a clock: a report of the same period over the same ledger is the same report.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from sqlalchemy.engine import Engine

from broker.finance.costs import Entry, Grouped, Sums, entries, iter_days
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
    """All the groupings in one pass over the entries."""
    names = ("team", "project", "provider", "kind", "day_team", "day_provider", "team_kind")
    groups: dict[str, Grouped] = {
        "team": Grouped(("team",)),
        "project": Grouped(("project",)),
        "provider": Grouped(("provider",)),
        "kind": Grouped(("kind",)),
        "day_team": Grouped(("day", "team")),
        "day_provider": Grouped(("day", "provider")),
        "team_kind": Grouped(("team", "kind")),
    }
    rows = [groups[n].rows for n in names]
    total = Sums()
    by_location: dict[str, Sums] = {"cloud": Sums(), "on-prem": Sums()}
    jobs: dict[str, tuple[str, str, Sums]] = {}
    days: dict[object, str] = {}
    for e in items:
        d = e.start.date()
        day = days.get(d)
        if day is None:
            day = days[d] = d.isoformat()
        keys = ((e.team,), (e.project,), (e.provider,), (e.kind,), (day, e.team), (day, e.provider), (e.team, e.kind))
        for table, key in zip(rows, keys, strict=True):
            sums = table.get(key)
            if sums is None:
                sums = table[key] = Sums()
            sums.cost_usd += e.usd
            sums.on_demand_usd += e.on_demand_usd
            sums.entries += 1
        for sums in (total, by_location["on-prem" if e.capacity_type == "on_prem" else "cloud"]):
            sums.cost_usd += e.usd
            sums.on_demand_usd += e.on_demand_usd
            sums.entries += 1
        slot = jobs.get(e.job_id)
        if slot is None:
            slot = jobs[e.job_id] = (e.team, e.project, Sums())
        slot[2].cost_usd += e.usd
        slot[2].on_demand_usd += e.on_demand_usd
        slot[2].entries += 1
    for g in groups.values():
        g.total = total
    top = sorted(((j, t, p, s) for j, (t, p, s) in jobs.items()), key=lambda r: (-r[3].cost_usd, r[0]))[:20]
    return ReportData(
        tenant=tenant,
        start=start,
        end=end,
        entries=items,
        days=list(iter_days(start, end)),
        total=total,
        by_team=groups["team"],
        by_project=groups["project"],
        by_provider=groups["provider"],
        by_kind=groups["kind"],
        by_day_team=groups["day_team"],
        by_day_provider=groups["day_provider"],
        by_team_kind=groups["team_kind"],
        by_location=by_location,
        top_jobs=top,
    )


def load(engine: Engine, tenant: str, start: datetime, end: datetime) -> ReportData:
    return build(entries(engine, tenant, start, end), tenant, start, end)
