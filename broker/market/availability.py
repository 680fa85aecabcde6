"""Spot pools' availability history in the database, and the `PoolOutlook`s the deadline-aware strategy reads.

`record_availability` is called by `store_offerings` for every feed refresh: it appends an `availability_change`
row when a spot pool is first listed and whenever its availability differs from the last recorded state (a pool
the feed stops listing counts as gone down), so the table grows with changes, not samples. `record_reclaim` adds
the broker's own reclaims (a preempted instance ends an up run; the next refresh listing the pool brings it back
up). `pool_outlooks` folds those rows into each pool's up/down run lengths over the last
`HISTORY_WINDOW`, adds the completed runs of any availability trace configured for the pool
(`OVERSPILL_INTERRUPTION_TRACES`, as prior history), and returns `PoolOutlook(up, age, up_runs, down_runs,
timeline)` by pool key (the timeline: the observed changes only, in time; a configured trace is not dated).
Only the past is read: this is what `federation.strategies.Overspill` may use.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta

from sqlalchemy import insert
from sqlmodel import Session, col, func, select

from broker.store.tables import AvailabilityChange
from federation.strategies import PoolOutlook, RunLengths, Timeline
from pricing.availability import Runs, runs_from_events
from providers.model import CapacityType, Offering

HISTORY_WINDOW = timedelta(days=14)


def _last_states(session: Session) -> dict[str, bool]:
    """The latest recorded state of every pool with history (changes are rare, so the table stays small)."""
    latest = select(func.max(AvailabilityChange.id)).group_by(AvailabilityChange.offering_key)
    rows = session.exec(  # type: ignore[call-overload]
        select(AvailabilityChange.offering_key, AvailabilityChange.up).where(col(AvailabilityChange.id).in_(latest))
    ).all()
    return dict(rows)


def record_availability(session: Session, offerings: Iterable[Offering], gone: Iterable[str], now: datetime) -> int:
    """After a feed refresh: append a change row for every spot pool in `offerings` whose availability differs
    from its last recorded state (or that has none yet), and a down row for every pool in `gone` (no longer
    listed) last seen up. Returns the rows added."""
    last = _last_states(session)
    rows = [
        {"offering_key": off.key, "up": off.available, "observed_at": now}
        for off in offerings
        if off.capacity_type is CapacityType.SPOT and last.get(off.key) != off.available
    ]
    rows.extend({"offering_key": key, "up": False, "observed_at": now} for key in gone if last.get(key))
    if rows:
        session.execute(insert(AvailabilityChange.__table__), rows)  # type: ignore[attr-defined]
    return len(rows)


def record_reclaim(session: Session, offering_key: str, at: datetime) -> None:
    """The provider took a spot instance back in `offering_key` at `at`: its capacity went away then (the next
    feed refresh that lists it available records it up again)."""
    session.add(AvailabilityChange(offering_key=offering_key, up=False, observed_at=at))


def _prior(key: str, trace_runs: Mapping[str, Runs]) -> Runs:
    """The runs of the configured trace whose prefix matches `key` (the longest wins)."""
    match = max((prefix for prefix in trace_runs if key.startswith(prefix)), key=len, default=None)
    return trace_runs[match] if match is not None else Runs()


def pool_outlooks(
    session: Session, keys: Iterable[str], now: datetime, trace_runs: Mapping[str, Runs] | None = None
) -> dict[str, PoolOutlook]:
    """`PoolOutlook` by pool key for the spot pools in `keys` that have any history (see the module docstring)."""
    wanted = set(keys)
    if not wanted:
        return {}
    since = now - HISTORY_WINDOW
    events: dict[str, list[tuple[datetime, bool]]] = defaultdict(list)
    for key, up, at in session.exec(  # type: ignore[call-overload]
        select(AvailabilityChange.offering_key, AvailabilityChange.up, AvailabilityChange.observed_at).where(
            col(AvailabilityChange.offering_key).in_(wanted), AvailabilityChange.observed_at >= since
        )
    ).all():
        events[key].append((at, up))
    out: dict[str, PoolOutlook] = {}
    for key in wanted:
        seen = runs_from_events(events.get(key, ()), now)
        prior = _prior(key, trace_runs or {})
        if seen is None:
            continue  # never observed: the strategy falls back to the pool's interruption rate
        runs = prior + seen.runs
        timeline = Timeline.of(sorted(e for e in events[key] if e[0] <= now))
        out[key] = PoolOutlook(seen.up, seen.age_hours, RunLengths.of(runs.up), RunLengths.of(runs.down), timeline)
    return out
