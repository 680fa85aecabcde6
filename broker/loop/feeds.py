"""Tick steps that read the outside world: refresh prices (offerings) and sample on-prem queue pressure.

Each feed is refreshed on its own: a failing feed records its error and keeps its last good data; the others go
on. Writes are upserts, so concurrent replicas refreshing together converge on the same rows.
"""

from __future__ import annotations

import logging
from datetime import datetime

from sqlalchemy import insert
from sqlmodel import Session, col, delete, select

from broker.catalog import row_from_offering
from broker.loop.common import upsert
from broker.runtime import Runtime
from broker.tables import FeedStatus, OfferingRow, PressureRow, PriceChange
from providers.model import Offering

log = logging.getLogger(__name__)


def _feed_status(session: Session, name: str, now: datetime, items: int, error: str = "") -> None:
    row: dict[str, object] = {"name": name, "items": items, "last_error": error[:1000]}
    if error:
        row["last_error_at"] = now
    else:
        row["last_success_at"] = now
    upsert(session, FeedStatus, [row], ["name"])


def store_offerings(session: Session, feed: str, offerings: list[Offering], now: datetime) -> int:
    """Replace one feed's pools with `offerings` and append a price-history row for every price that changed.

    Pools the feed no longer lists are removed. Returns the number of price changes recorded.
    """
    previous = {
        key: (hourly, estimated)
        for key, hourly, estimated in session.exec(  # type: ignore[call-overload]
            select(OfferingRow.key, OfferingRow.hourly_usd, OfferingRow.estimated).where(OfferingRow.feed == feed)
        ).all()
    }
    rows = [row_from_offering(o, now, feed).model_dump() for o in offerings]
    for start in range(0, len(rows), 1000):
        upsert(session, OfferingRow, rows[start : start + 1000], ["key"])
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
    for start in range(0, len(changes), 1000):
        session.execute(insert(PriceChange), changes[start : start + 1000])
    gone = set(previous) - {o.key for o in offerings}
    if gone:
        session.exec(delete(OfferingRow).where(col(OfferingRow.key).in_(gone)))  # type: ignore[call-overload]
    return len(changes)


def refresh_prices(rt: Runtime, now: datetime) -> int:
    """Fetch every offering source; replace each feed's rows with what it returned. Returns pools written."""
    written = 0
    for source in rt.offering_sources:
        feed = f"prices:{source.name}"
        try:
            offerings = source.offerings(now)
        except Exception as exc:  # one feed's failure must not stop the others; last good data is kept
            log.warning("price feed %s failed: %s", feed, exc)
            with Session(rt.engine) as session:
                _feed_status(session, feed, now, 0, f"{type(exc).__name__}: {exc}")
                session.commit()
            continue
        with Session(rt.engine) as session:
            store_offerings(session, feed, offerings, now)
            _feed_status(session, feed, now, len(offerings))
            session.commit()
        written += len(offerings)
    rt.catalog.invalidate()
    return written


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
                _feed_status(session, feed, now, 0, f"{type(exc).__name__}: {exc}")
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
            _feed_status(session, feed, now, len(rows))
            session.commit()
        written += len(rows)
    return written
