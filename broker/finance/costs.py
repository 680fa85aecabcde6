"""Reading the ledger: a tenant's entries in a time window, and their sums grouped by any of `GROUP_KEYS`.

An entry belongs to the window when its period starts inside `[start, end)`. Accrual cuts entries at UTC
midnight, so day and month windows are exact. Sums are Decimal, added in Python (SQLite keeps money as text,
and SQL SUM over it would be a float). Savings are `on_demand_usd - cost_usd`: what the same hours would have
cost on the pool's on-demand twin, minus what they cost.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import NamedTuple

from sqlalchemy import select
from sqlalchemy.engine import Engine

from broker.tables import CostEntryRow

GROUP_KEYS = ("team", "project", "job", "provider", "region", "capacity_type", "kind", "day", "month")
ZERO = Decimal("0")


class Entry(NamedTuple):
    id: int
    job_id: str
    placement_id: str | None
    team: str
    project: str
    provider: str
    region: str
    zone: str
    instance_type: str
    resource_id: str
    capacity_type: str
    kind: str
    start: datetime
    end: datetime
    hourly_usd: Decimal
    usd: Decimal
    on_demand_usd: Decimal
    quantity: Decimal
    unit: str
    corrects_id: int | None


_COLUMNS = (
    CostEntryRow.id,
    CostEntryRow.job_id,
    CostEntryRow.placement_id,
    CostEntryRow.team,
    CostEntryRow.project,
    CostEntryRow.provider,
    CostEntryRow.region,
    CostEntryRow.zone,
    CostEntryRow.instance_type,
    CostEntryRow.resource_id,
    CostEntryRow.capacity_type,
    CostEntryRow.kind,
    CostEntryRow.period_start_at,
    CostEntryRow.period_end_at,
    CostEntryRow.hourly_usd,
    CostEntryRow.usd,
    CostEntryRow.on_demand_usd,
    CostEntryRow.quantity,
    CostEntryRow.unit,
    CostEntryRow.corrects_id,
)


def entries(engine: Engine, tenant: str, start: datetime, end: datetime) -> list[Entry]:
    """Every entry of `tenant` whose period starts in `[start, end)`, in id order (the order they were written)."""
    query = (
        select(*_COLUMNS)
        .where(
            CostEntryRow.tenant == tenant,
            CostEntryRow.period_start_at >= start,
            CostEntryRow.period_start_at < end,
        )
        .order_by(CostEntryRow.id)
    )
    with engine.connect() as conn:
        return [Entry(*row) for row in conn.execute(query)]


def key_of(e: Entry, name: str) -> str:
    if name == "job":
        return e.job_id
    if name == "day":
        return e.start.strftime("%Y-%m-%d")
    if name == "month":
        return e.start.strftime("%Y-%m")
    return str(getattr(e, name))


@dataclass
class Sums:
    cost_usd: Decimal = ZERO
    on_demand_usd: Decimal = ZERO
    entries: int = 0

    def add(self, e: Entry) -> None:
        self.cost_usd += e.usd
        self.on_demand_usd += e.on_demand_usd
        self.entries += 1

    @property
    def savings_usd(self) -> Decimal:
        return self.on_demand_usd - self.cost_usd

    def money(self) -> dict[str, str]:
        return {
            "cost_usd": _fmt(self.cost_usd),
            "on_demand_usd": _fmt(self.on_demand_usd),
            "savings_usd": _fmt(self.savings_usd),
        }


@dataclass
class Grouped:
    group_by: tuple[str, ...]
    rows: dict[tuple[str, ...], Sums] = field(default_factory=dict)
    total: Sums = field(default_factory=Sums)

    def sorted_rows(self) -> list[tuple[tuple[str, ...], Sums]]:
        """Rows ordered by their keys (days and months in time order), deterministic for reports."""
        return sorted(self.rows.items(), key=lambda kv: kv[0])


def group(items: Iterable[Entry], group_by: Sequence[str]) -> Grouped:
    """Sum entries per combination of `group_by` keys (each one of GROUP_KEYS)."""
    unknown = [g for g in group_by if g not in GROUP_KEYS]
    if unknown:
        raise ValueError(f"unknown group_by key(s) {', '.join(unknown)}; use {', '.join(GROUP_KEYS)}")
    out = Grouped(tuple(group_by))
    for e in items:
        key = tuple(key_of(e, g) for g in group_by)
        sums = out.rows.get(key)
        if sums is None:
            sums = out.rows[key] = Sums()
        sums.add(e)
        out.total.add(e)
    return out


def _fmt(d: Decimal) -> str:
    """Money on the wire: exact, no exponent, trailing zeros dropped ("12.34", "20")."""
    text = format(d, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def money(d: Decimal) -> str:
    return _fmt(d)


def iter_days(start: datetime, end: datetime) -> Iterator[str]:
    """Every UTC day in `[start, end)` as YYYY-MM-DD (the x axis of the daily charts)."""
    from datetime import timedelta

    day = start.date()
    while datetime.combine(day, datetime.min.time(), tzinfo=start.tzinfo) < end:
        yield day.isoformat()
        day += timedelta(days=1)
