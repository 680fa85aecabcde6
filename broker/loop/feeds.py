"""Tick steps that read the outside world: refresh prices (offerings) and sample on-prem queue pressure.

Each feed is refreshed on its own: a failing feed records its error and keeps its last good data; the others go
on. Writes are upserts, so concurrent replicas refreshing together converge on the same rows.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import Float, case, cast, func, insert, literal
from sqlmodel import Session, col, delete, select

from broker.loop.common import upsert
from broker.market.availability import record_availability
from broker.market.catalog import offering_values
from broker.runtime import Runtime
from broker.services.bulkhead import Bulkhead, Record, bulkhead
from broker.store.db import UTCDateTime
from broker.store.tables import FeedStatus, OfferingRow, Placement, PressureRow, PriceChange
from pricing.bounds import offering_refusal
from pricing.risk import PoolExperience, apply_experience, apply_trace_priors, experience_from_runs
from providers.model import CapacityType, Offering, PlacementState

log = logging.getLogger(__name__)


def record_feed_status(session: Session, name: str, now: datetime, items: int, error: str = "") -> None:
    row: dict[str, object] = {"name": name, "items": items, "last_error": error[:1000]}
    if error:
        row["last_error_at"] = now
    else:
        row["last_success_at"] = now
    upsert(session, FeedStatus, [row], ["name"])


def store_offerings(session: Session, feed: str, offerings: list[Offering], now: datetime) -> int:
    """Replace one feed's pools with `offerings` and append a price-history row for every price that changed.

    Pools the feed no longer lists are removed. A pool that another feed listed before (two catalog files that
    overlap) moves to this feed; its price counts as changed only if it differs from the one stored. Returns the
    number of price changes recorded.
    """
    previous = _stored_prices(session, OfferingRow.feed == feed)
    listed = {o.key for o in offerings}
    owned = set(previous)
    moved = sorted(listed - owned)
    for start in range(0, len(moved), _KEY_BATCH):
        previous.update(_stored_prices(session, col(OfferingRow.key).in_(moved[start : start + _KEY_BATCH])))
    record_availability(session, offerings, owned - listed, now)
    upsert(session, OfferingRow, [offering_values(o, now, feed) for o in offerings], ["key"])
    changes = [
        {
            "offering_key": o.key,
            "feed": feed,
            "hourly_usd": o.price.hourly_usd,
            "price_source": o.price.source,
            "estimated": o.price.estimated,
            "observed_at": o.price.observed_at,
        }
        for o in offerings
        if previous.get(o.key) != (o.price.hourly_usd, o.price.estimated)
    ]
    if changes:
        session.execute(insert(PriceChange.__table__), changes)  # type: ignore[attr-defined]
    gone = owned - listed
    if gone:
        session.exec(delete(OfferingRow).where(col(OfferingRow.key).in_(gone)))  # type: ignore[call-overload]
    return len(changes)


_KEY_BATCH = 5000  # keys per IN list when looking up pools another feed listed


def _stored_prices(session: Session, where: Any) -> dict[str, tuple[Decimal, bool]]:
    """(hourly price, estimated) by pool key for the stored pools matching `where`."""
    return {
        key: (hourly, estimated)
        for key, hourly, estimated in session.exec(  # type: ignore[call-overload]
            select(OfferingRow.key, OfferingRow.hourly_usd, OfferingRow.estimated).where(where)
        ).all()
    }


EXPERIENCE_WINDOW = timedelta(days=14)


def pool_experience(session: Session, now: datetime, half_life_hours: float = 72.0) -> dict[str, PoolExperience]:
    """The broker's own spot history per pool over the last two weeks, decayed (see pricing.risk): on PostgreSQL
    one aggregate statement returning a row per pool (the same sums as `pricing.risk.experience_from_runs`, in
    double precision; with tens of thousands of spot placements running, reading a row per placement was a tenth
    of a tick), elsewhere the four columns it needs per placement, summed here."""
    since = now - EXPERIENCE_WINDOW
    spot = (
        Placement.capacity_type == CapacityType.SPOT.value,
        col(Placement.started_at).is_not(None),
        col(Placement.created_at) >= since,
    )
    if session.get_bind().dialect.name == "postgresql":
        return _pool_experience_sql(session, now, half_life_hours, spot)
    rows = session.exec(
        select(  # type: ignore[call-overload]
            Placement.offering_key, Placement.started_at, Placement.ended_at, Placement.state
        ).where(*spot)
    ).all()
    runs: dict[str, list[tuple[datetime, datetime, bool]]] = defaultdict(list)
    for key, started_at, ended_at, state in rows:
        end = min(ended_at or now, now)
        runs[key].append((started_at, end, state == PlacementState.PREEMPTED.value))
    return {key: experience_from_runs(r, now, half_life_hours) for key, r in runs.items()}


def _pool_experience_sql(
    session: Session, now: datetime, half_life_hours: float, where: tuple[Any, ...]
) -> dict[str, PoolExperience]:
    at_now = literal(now, UTCDateTime())
    end = func.least(func.coalesce(Placement.ended_at, at_now), at_now)
    hours = func.greatest(cast(func.extract("epoch", end - Placement.started_at), Float) / 3600.0, 0.0)
    age = func.greatest(cast(func.extract("epoch", at_now - end), Float) / 3600.0, 0.0)
    weight = func.power(literal(0.5, Float), age / float(half_life_hours))
    preempted = case((Placement.state == PlacementState.PREEMPTED.value, weight), else_=0.0)
    rows = session.exec(
        select(Placement.offering_key, func.sum(weight * hours), func.sum(preempted))  # type: ignore[call-overload]
        .where(*where)
        .group_by(Placement.offering_key)
    ).all()
    return {key: PoolExperience(float(run_hours), float(reclaims)) for key, run_hours, reclaims in rows}


def _due(session: Session, feed: str, now: datetime, every_seconds: float) -> bool:
    if every_seconds <= 0:
        return True
    status = session.get(FeedStatus, feed)
    return (
        status is None
        or status.last_success_at is None
        or (now - status.last_success_at).total_seconds() >= every_seconds
    )


def refresh_prices(rt: Runtime, now: datetime, *, force: bool = False) -> int:
    """Fetch every offering source that is due; replace each feed's rows with what it returned (spot rates
    adjusted by the broker's own reclaim experience). Returns pools written."""
    with bulkhead(rt, "refresh_prices", now) as bh:
        return _refresh(rt, now, force, bh)


def _feed_error(rt: Runtime, feed: str, now: datetime) -> Record:
    """The bulkhead's record for a feed: its `last_error` (its last good data is kept)."""

    def record(exc: BaseException, quarantined: bool) -> None:
        with Session(rt.engine) as session:
            record_feed_status(session, feed, now, 0, f"{type(exc).__name__}: {exc}"[:1000])
            session.commit()

    return record


def _refresh(rt: Runtime, now: datetime, force: bool, bh: Bulkhead) -> int:
    written = 0
    experience: dict[str, PoolExperience] | None = None  # read once, and only when some feed is due
    for source in rt.offering_sources:
        feed = f"prices:{source.name}"
        with Session(rt.engine) as session:
            if not force and not _due(session, feed, now, float(getattr(source, "refresh_seconds", 0.0))):
                continue
            if experience is None:
                experience = pool_experience(session, now)
        try:
            offerings = apply_experience(
                apply_trace_priors(_sane(rt, feed, source.offerings(now), now), rt.trace_priors), experience
            )
        except Exception as exc:  # one feed's failure must not stop the others; last good data is kept
            log.warning("price feed %s failed: %s", feed, exc)
            with Session(rt.engine) as session:
                record_feed_status(session, feed, now, 0, f"{type(exc).__name__}: {exc}")
                session.commit()
            continue
        with bh.item(feed, _feed_error(rt, feed, now)):  # the feed's last_error says why; the others go on
            with Session(rt.engine) as session:
                store_offerings(session, feed, offerings, now)
                record_feed_status(session, feed, now, len(offerings))
                session.commit()
            written += len(offerings)
    rt.catalog.invalidate()
    return written


def _sane(rt: Runtime, feed: str, offerings: list[Offering], now: datetime) -> list[Offering]:
    """The offerings of `feed` within bounds (`pricing.bounds.offering_refusal`); each refused one is logged and
    counted (`overspill_tick_item_errors_total{step="refresh_prices"}`), the others are stored as before."""
    kept = []
    for o in offerings:
        why = offering_refusal(o, now)
        if why is None:
            kept.append(o)
            continue
        rt.metrics.item_errors.labels("refresh_prices").inc()
        log.warning("price feed %s: refused the pool %s: %s", feed, getattr(o, "key", "?"), why)
    return kept


def sample_pressure(rt: Runtime, now: datetime) -> int:
    """Record each on-prem scheduler's queue pressure per GPU type."""
    written = 0
    for source in rt.pressure_sources:
        feed = f"pressure:{source.name}"
        try:
            samples = source.pressure(now)
        except Exception as exc:  # keep the last sample; the feed status says it is stale
            log.warning("pressure feed %s failed: %s", feed, exc)
            with Session(rt.engine) as session:
                record_feed_status(session, feed, now, 0, f"{type(exc).__name__}: {exc}")
                session.commit()
            continue
        rows = [
            {
                "source": source.name,
                "accelerator": s.accelerator,
                "total_gpus": s.total_gpus,
                "free_gpus": s.free_gpus,
                "pending_jobs": s.pending_jobs,
                "pending_gpus": s.pending_gpus,
                "expected_wait_hours": s.expected_wait_hours,
                "observed_at": s.observed_at,
            }
            for s in samples
        ]
        with Session(rt.engine) as session:
            upsert(session, PressureRow, rows, ["source", "accelerator"])
            record_feed_status(session, feed, now, len(rows))
            session.commit()
        written += len(rows)
    return written
