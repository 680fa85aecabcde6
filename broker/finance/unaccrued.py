"""What running placements have cost that the ledger does not hold yet, read in one aggregate query.

The tick accrues a running placement only once its unaccrued stretch reaches `accrual_cadence_seconds`
(`broker.loop.accrue`), so between two accruals a job's `spent_usd` and the ledger's sums trail its real spend by
up to a cadence and a tick. Every reader that guards money against a limit adds this stretch: the ceiling guard
(`broker.loop.sync`, per placement, from the placement's own columns), budgets and the hard-budget gate
(`broker.finance.budgets`, per team or project), a lowered `max_total_usd` (`broker.services.jobs`, per job) and
the placement of a pending job whose last run ended this tick (`broker.loop.place`).

Contract of `unaccrued_usd(conn, now, *conditions, since=None, extras=None)` (and of `unaccrued_by`, the same per
group of placements, e.g. per team, in the same one statement): an upper bound of what the next
accruals will add for the placements matching `conditions` (SQL on the `placement` and `job` tables) that run or
ended unaccrued, counting each one's time from `accrued_until` (or its start; not before `since`) to `now` (or its
end), at the highest rate it
can be charged (its placement price or its price segment's; a moved price is accrued at once) plus its
instance's extras (`extras`, by provider), rounded up to the cent. One statement whatever the number of
placements: the SQL sums rate x hours grouped by provider and capacity type (the extras' keys), the extras are
added per group.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from decimal import ROUND_CEILING, Decimal
from typing import Any

from sqlalchemy import Float, cast, func, literal, or_, select
from sqlalchemy.engine import Connection

from broker.store.db import UTCDateTime
from broker.store.tables import Job, Placement
from pricing.extras import InstanceExtras
from providers.model import PlacementState

_P = Placement.__table__  # type: ignore[attr-defined]
_J = Job.__table__  # type: ignore[attr-defined]
CENT = Decimal("0.01")


def hours_and_rate(dialect: str, now: datetime, since: datetime | None = None) -> tuple[Any, Any]:
    """SQL for each placement's unaccrued hours up to `now` (0 when none) and its highest rate."""
    start: Any = func.coalesce(_P.c.accrued_until, _P.c.started_at)
    at_now = literal(now, UTCDateTime())
    segment = func.coalesce(_P.c.price_segment_hourly_usd, _P.c.hourly_usd)
    if dialect == "postgresql":
        if since is not None:
            start = func.greatest(start, literal(since, UTCDateTime()))
        end = func.least(func.coalesce(_P.c.ended_at, at_now), at_now)
        hours = func.greatest(func.extract("epoch", end - start) / 3600, 0)
        return hours, func.greatest(_P.c.hourly_usd, segment)
    if since is not None:
        start = func.max(start, literal(since, UTCDateTime()))
    end = func.min(func.coalesce(_P.c.ended_at, at_now), at_now)
    hours = func.max((func.julianday(end) - func.julianday(start)) * 24, 0)
    return hours, func.max(cast(_P.c.hourly_usd, Float), cast(segment, Float))


def unaccrued_usd(
    conn: Connection,
    now: datetime,
    *conditions: Any,
    since: datetime | None = None,
    extras: Mapping[str, InstanceExtras] | None = None,
) -> Decimal:
    """See the module docstring. `conditions` may name `job` columns (the placement's job is joined)."""
    return unaccrued_by(conn, now, (), *conditions, since=since, extras=extras).get((), Decimal("0"))


def unaccrued_by(
    conn: Connection,
    now: datetime,
    keys: Sequence[Any],
    *conditions: Any,
    since: datetime | None = None,
    extras: Mapping[str, InstanceExtras] | None = None,
) -> dict[tuple[Any, ...], Decimal]:
    """`unaccrued_usd` for each group of the placements matching `conditions`, grouped by the SQL `keys`
    (e.g. the job's tenant and team), in the same one statement: the tuple of the keys' values -> its stretch,
    each group's rounded up to the cent on its own (what `unaccrued_usd` with that group's conditions returns).
    Groups with nothing unaccrued may be missing."""
    hours, rate = hours_and_rate(conn.dialect.name, now, since)
    rows = conn.execute(
        select(*keys, _P.c.provider, _P.c.capacity_type, func.sum(hours * rate), func.sum(hours))
        .select_from(_P.join(_J, _J.c.id == _P.c.job_id))
        .where(
            _P.c.started_at.is_not(None),
            or_(_P.c.state == PlacementState.RUNNING.value, _P.c.accrued_until < _P.c.ended_at),
            *conditions,
        )
        .group_by(*keys, _P.c.provider, _P.c.capacity_type)
    ).all()
    totals: dict[tuple[Any, ...], Decimal] = {}
    width = len(keys)
    for row in rows:
        key, (provider, capacity, usd, total_hours) = tuple(row[:width]), row[width:]
        if usd is None or total_hours is None:
            continue
        total = totals.get(key, Decimal("0")) + Decimal(str(usd))
        ex = (extras or {}).get(provider)
        if ex is not None:
            total += ex.hourly_usd(capacity) * Decimal(str(total_hours))
        totals[key] = total
    return {
        key: total.quantize(CENT, rounding=ROUND_CEILING) if total > 0 else Decimal("0")
        for key, total in totals.items()
    }
