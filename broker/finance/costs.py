"""Reading the ledger: a tenant's entries in a time window, and their sums grouped by any of `GROUP_KEYS`.

An entry belongs to the window when its period starts inside `[start, end)`. Accrual cuts entries at UTC
midnight, so day and month windows are exact. Sums are Decimal, added in Python (SQLite keeps money as text,
and SQL SUM over it would be a float).

What a `Sums` holds (exact; `shown` rounds a table of them for people, `broker.finance.money`):
- `cost_usd`: everything the entries cost, wasted work included.
- `wasted_usd`: the part of it that paid for work lost to preemptions (kind `wasted`): a loss, never a saving.
- `on_demand_usd`: the on-demand equivalent of the useful work: what the `compute` entries' hours would have
  cost on their pool's on-demand twin (as accrued), plus every other useful kind at its own cost (`disk`,
  `public_ip`, `egress`, `storage` and `correction` have no spot price, so no saving). Wasted work counts 0:
  on-demand capacity would not have lost it.
- `savings_usd` = `on_demand_usd - (cost_usd - wasted_usd)`: what spot saved on the useful work ("saved by
  spot"). What preemptions cost is `wasted_usd`, beside it; `on_demand_usd - cost_usd` is the net of the two.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import Decimal
from functools import lru_cache
from operator import attrgetter
from typing import Any, NamedTuple

from sqlalchemy import String, select, type_coerce
from sqlalchemy.engine import Engine

from broker.finance.money import allocate, plain
from broker.store.tables import CostEntryRow

GROUP_KEYS = ("team", "project", "job", "placement", "provider", "region", "capacity_type", "kind", "day", "month")
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


def _money(value: Any) -> Decimal:
    return value if isinstance(value, Decimal) else Decimal(value)


def _utc(value: Any) -> datetime:
    if isinstance(value, datetime):
        return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)
    return datetime.fromisoformat(value).replace(tzinfo=UTC)


_RAW = {"period_start_at", "period_end_at", "hourly_usd", "usd", "on_demand_usd", "quantity"}


def entries(engine: Engine, tenant: str, start: datetime, end: datetime) -> list[Entry]:
    """Every entry of `tenant` whose period starts in `[start, end)`, in id order (the order they were written).

    Money and time columns are read raw and converted here in one pass (the column types' per-value hooks
    cost more than the query on a month of entries)."""
    columns = [type_coerce(c, String) if c.key in _RAW else c for c in _COLUMNS]
    query = (
        select(*columns)
        .where(
            CostEntryRow.tenant == tenant,
            CostEntryRow.period_start_at >= start,
            CostEntryRow.period_start_at < end,
        )
        .order_by(CostEntryRow.id)
    )
    out: list[Entry] = []
    with engine.connect() as conn:
        for r in conn.execute(query):
            out.append(
                Entry(
                    r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10], r[11],
                    _utc(r[12]), _utc(r[13]), _money(r[14]), _money(r[15]), _money(r[16]), _money(r[17]),
                    r[18], r[19],
                )
            )  # fmt: skip
    return out


@lru_cache(maxsize=4096)
def _iso(d: date) -> str:
    return d.isoformat()


def day_of(e: Entry) -> str:
    """The UTC day an entry belongs to, YYYY-MM-DD."""
    return _iso(e.start.date())


_KEYS: dict[str, Callable[[Entry], str]] = {
    "team": attrgetter("team"),
    "project": attrgetter("project"),
    "job": attrgetter("job_id"),
    "placement": lambda e: e.placement_id or "",  # one attempt of a job; "" for an entry of no placement
    "provider": attrgetter("provider"),
    "region": attrgetter("region"),
    "capacity_type": attrgetter("capacity_type"),
    "kind": attrgetter("kind"),
    "day": day_of,
    "month": lambda e: day_of(e)[:7],
}


def key_of(e: Entry, name: str) -> str:
    return _KEYS[name](e)


SPOT_SAVING_KINDS = frozenset({"compute"})  # the only kind whose on-demand equivalent differs from its cost
WASTED = "wasted"


def on_demand_of(e: Entry) -> Decimal:
    """An entry's on-demand equivalent (see the module docstring): its accrued counterfactual for compute, 0 for
    wasted work, its own cost for every other kind."""
    if e.kind in SPOT_SAVING_KINDS:
        return e.on_demand_usd
    return ZERO if e.kind == WASTED else e.usd


@dataclass(slots=True)
class Sums:
    cost_usd: Decimal = ZERO
    on_demand_usd: Decimal = ZERO
    wasted_usd: Decimal = ZERO
    entries: int = 0

    def add(self, e: Entry) -> None:
        self.cost_usd += e.usd
        if e.kind in SPOT_SAVING_KINDS:
            self.on_demand_usd += e.on_demand_usd
        elif e.kind == WASTED:
            self.wasted_usd += e.usd
        else:
            self.on_demand_usd += e.usd
        self.entries += 1

    def merge(self, other: Sums) -> None:
        self.cost_usd += other.cost_usd
        self.on_demand_usd += other.on_demand_usd
        self.wasted_usd += other.wasted_usd
        self.entries += other.entries

    def minus(self, other: Sums) -> Sums:
        return Sums(
            self.cost_usd - other.cost_usd,
            self.on_demand_usd - other.on_demand_usd,
            self.wasted_usd - other.wasted_usd,
            self.entries - other.entries,
        )

    @property
    def savings_usd(self) -> Decimal:
        """Saved by spot on the useful work (wasted work is a loss, not a saving)."""
        return self.on_demand_usd - (self.cost_usd - self.wasted_usd)

    def money(self) -> dict[str, str]:
        """The exact amounts as wire strings."""
        return {
            "cost_usd": _fmt(self.cost_usd),
            "wasted_usd": _fmt(self.wasted_usd),
            "on_demand_usd": _fmt(self.on_demand_usd),
            "savings_usd": _fmt(self.savings_usd),
        }


MONEY_FIELDS = ("cost_usd", "wasted_usd", "on_demand_usd", "savings_usd")


class Shown(NamedTuple):
    """A line of `Sums` rounded for display (cents, Decimal), allocated with the other lines of its table."""

    cost_usd: Decimal
    wasted_usd: Decimal
    on_demand_usd: Decimal
    savings_usd: Decimal

    def plain(self) -> dict[str, str]:
        """Display strings ("1234.56") per money field, as the API's `display` object carries them."""
        return {f: plain(getattr(self, f)) for f in MONEY_FIELDS}


def shown(lines: Sequence[Sums]) -> tuple[list[Shown], Shown]:
    """A table's lines and its footer rounded for display (`broker.finance.money`).

    Cost, wasted and savings are each allocated on their own (largest remainder), so each of those columns adds
    up exactly to its footer, and each footer is its exact total rounded half-even (the same figure in every
    table of a report). The on-demand equivalent is derived on every line and in the footer as cost - wasted +
    savings, so the arithmetic a reader checks holds to the cent (a line without a spot saving shows its cost as
    its on-demand equivalent); its footer may differ by a cent from the exact on-demand total rounded."""
    cost, wasted, savings = (
        allocate([getattr(s, f) for s in lines]) for f in ("cost_usd", "wasted_usd", "savings_usd")
    )

    def line(c: Decimal, w: Decimal, sv: Decimal) -> Shown:
        return Shown(cost_usd=c, wasted_usd=w, on_demand_usd=c - w + sv, savings_usd=sv)

    rows = [line(*values) for values in zip(cost, wasted, savings, strict=True)]
    return rows, line(sum(cost, ZERO), sum(wasted, ZERO), sum(savings, ZERO))


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
    keyers = [_KEYS[g] for g in group_by]
    rows = out.rows
    total = out.total
    for e in items:
        key = tuple(k(e) for k in keyers)
        sums = rows.get(key)
        if sums is None:
            sums = rows[key] = Sums()
        sums.add(e)
        total.add(e)
    return out


def as_of(items: Iterable[Entry], end: datetime) -> datetime | None:
    """The ledger's latest accrued time among `items` (the latest end of an entry, at most `end`): the "data as of"
    of a report or a summary. None without entries. Derived from the data, never from a clock, so the same
    ledger gives the same answer."""
    latest = max((e.end for e in items), default=None)
    return None if latest is None else min(latest, end)


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
