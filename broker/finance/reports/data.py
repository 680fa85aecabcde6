"""The numbers every report format shows, computed once from a period's ledger entries.

Nothing here reads a clock: a report of the same period over the same ledger is the same report. Its "data as of"
is the ledger's latest accrued time among the period's entries (`costs.as_of`), and whether the period was still
running when the report was made (`open`, decided by the caller from the run's time) only changes its title
("1-25 November 2026 (month to date)") and cuts its daily charts at the last day with data.

Amounts here are exact; the formats round them for people with `broker.finance.costs.shown` (one rule,
`broker.finance.money`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from sqlalchemy.engine import Engine
from sqlmodel import col, select

from broker.finance.costs import WASTED, Entry, Grouped, Sums, as_of, entries, iter_days, on_demand_of
from broker.finance.reports.period import title
from broker.store.tables import Job

ZERO = Decimal("0")
TOP_JOBS = 20


@dataclass
class TopJob:
    """One of the period's costliest jobs: who ran it, where (provider region capacity, costliest place first)."""

    job_id: str
    name: str
    team: str
    project: str
    places: list[str]
    sums: Sums

    def where(self, most: int = 3) -> str:
        shown = ", ".join(self.places[:most])
        return shown + (f" +{len(self.places) - most} more" if len(self.places) > most else "")


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
    top_jobs: list[TopJob]  # costliest first
    other_jobs: Sums  # every job not in top_jobs, so that the table adds up to the period's total
    job_count: int
    as_of: datetime | None  # the ledger's latest accrued time in the period; None without entries
    open: bool = False  # the period had not ended when the report was made

    @property
    def title(self) -> str:
        """The period for people: "November 2026", "1-25 November 2026 (month to date)"."""
        return title(self.start, self.end, through=(self.as_of or self.start) if self.open else None)

    @property
    def as_of_text(self) -> str:
        """ "data as of 2026-11-25 10:30 UTC" (the latest accrued entry), or that there is none."""
        if self.as_of is None:
            return "no ledger entries in this period"
        return f"data as of {self.as_of.astimezone(UTC):%Y-%m-%d %H:%M} UTC"

    def series(self, grouped: Grouped) -> dict[str, list[Decimal]]:
        """A (day, name) grouping as one list of daily costs per name, names sorted, days in order."""
        index = {d: i for i, d in enumerate(self.days)}
        out: dict[str, list[Decimal]] = {}
        for (day, name), sums in grouped.sorted_rows():
            if day in index:
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


def _place(e: Entry) -> str:
    """Where an entry ran, for people: "aws us-east-1 spot", "onprem-slurm on-prem"."""
    region = "" if e.region in e.provider else e.region
    return " ".join(x for x in (e.provider, region, e.capacity_type.replace("_", "-")) if x)


def build(
    items: list[Entry],
    tenant: str,
    start: datetime,
    end: datetime,
    *,
    open: bool = False,
    names: dict[str, str] | None = None,
) -> ReportData:
    """All the groupings in one pass over the entries. `open`: the period had not ended when the report was made;
    `names`: job names by id (for the costliest jobs)."""
    groups: dict[str, Grouped] = {
        "team": Grouped(("team",)),
        "project": Grouped(("project",)),
        "provider": Grouped(("provider",)),
        "kind": Grouped(("kind",)),
        "day_team": Grouped(("day", "team")),
        "day_provider": Grouped(("day", "provider")),
        "team_kind": Grouped(("team", "kind")),
    }
    rows = [g.rows for g in groups.values()]
    total = Sums()
    by_location: dict[str, Sums] = {"cloud": Sums(), "on-prem": Sums()}
    jobs: dict[str, tuple[str, str, Sums, dict[str, Decimal]]] = {}
    days: dict[object, str] = {}
    places: dict[str | None, str] = {}  # where each placement ran (one place per placement)
    for e in items:
        d = e.start.date()
        day = days.get(d)
        if day is None:
            day = days[d] = d.isoformat()
        keys = ((e.team,), (e.project,), (e.provider,), (e.kind,), (day, e.team), (day, e.provider), (e.team, e.kind))
        slot = jobs.get(e.job_id)
        if slot is None:
            slot = jobs[e.job_id] = (e.team, e.project, Sums(), {})
        targets = [total, by_location["on-prem" if e.capacity_type == "on_prem" else "cloud"], slot[2]]
        for table, key in zip(rows, keys, strict=True):
            sums = table.get(key)
            if sums is None:
                sums = table[key] = Sums()
            targets.append(sums)
        usd, od = e.usd, on_demand_of(e)  # what Sums.add does, once per entry for its ten sums
        wasted = usd if e.kind == WASTED else None
        for sums in targets:
            sums.cost_usd += usd
            sums.on_demand_usd += od
            if wasted is not None:
                sums.wasted_usd += wasted
            sums.entries += 1
        place = places.get(e.placement_id) if e.placement_id else _place(e)
        if place is None:
            place = places[e.placement_id] = _place(e)
        slot[3][place] = slot[3].get(place, ZERO) + usd
    for g in groups.values():
        g.total = total
    ranked = sorted(jobs.items(), key=lambda kv: (-kv[1][2].cost_usd, kv[0]))
    top = [
        TopJob(
            job_id=j,
            name=(names or {}).get(j, ""),
            team=t,
            project=p,
            places=[k for k, _ in sorted(places.items(), key=lambda kv: (-kv[1], kv[0]))],
            sums=s,
        )
        for j, (t, p, s, places) in ranked[:TOP_JOBS]
    ]
    others = Sums()
    for _, (_, _, s, _) in ranked[TOP_JOBS:]:
        others.merge(s)
    latest = as_of(items, end)
    through = (latest or start) if open else end
    last_day = max(start, min(end, through) - timedelta(microseconds=1)).date()
    cut = min(end, datetime.combine(last_day + timedelta(days=1), datetime.min.time(), tzinfo=start.tzinfo))
    return ReportData(
        tenant=tenant,
        start=start,
        end=end,
        entries=items,
        days=list(iter_days(start, cut)),
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
        other_jobs=others,
        job_count=len(jobs),
        as_of=latest,
        open=open,
    )


def job_names(engine: Engine, tenant: str, ids: list[str]) -> dict[str, str]:
    """The names of the tenant's jobs `ids` (jobs keep their name: a report stays the same)."""
    if not ids:
        return {}
    with engine.connect() as conn:
        found = conn.execute(select(Job.id, Job.name).where(Job.tenant == tenant, col(Job.id).in_(ids)))
        return {job_id: name for job_id, name in found}


def load(engine: Engine, tenant: str, start: datetime, end: datetime, *, now: datetime | None = None) -> ReportData:
    """The report data of `[start, end)` for `tenant`. `now`, the run's time, only decides whether the period
    was still running (`open`)."""
    items = entries(engine, tenant, start, end)
    is_open = now is not None and now < end
    first = build(items, tenant, start, end, open=is_open)
    names = job_names(engine, tenant, [j.job_id for j in first.top_jobs])
    for job in first.top_jobs:
        job.name = names.get(job.job_id, "")
    return first
