"""Loading the PriceBook from the `offering` table, cached per process.

The tick's price refresh writes the table; API handlers and the placement step read an immutable PriceBook
built from it. A process rebuilds its snapshot when the table's newest `refreshed_at` moves (checked at most
every `check_seconds`), so a refresh by another replica is picked up quickly and no query runs per request.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime
from typing import Any

from sqlalchemy import func
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from broker.store.tables import FeedStatus, OfferingRow
from pricing.book import PriceBook
from providers.model import CapacityType, Offering, Price


def offering_from_row(row: OfferingRow) -> Offering:
    return Offering(
        provider=row.provider,
        region=row.region,
        zone=row.zone,
        instance_type=row.instance_type,
        accelerator=row.accelerator,
        accelerator_count=row.accelerator_count,
        gpu_memory_gib=row.gpu_memory_gib,
        vcpus=row.vcpus,
        memory_gib=row.memory_gib,
        capacity_type=CapacityType(row.capacity_type),
        price=Price(row.hourly_usd, row.price_source, row.observed_at, row.estimated),
        interruption_rate_per_hour=row.interruption_rate_per_hour,
        egress_usd_per_gb=row.egress_usd_per_gb,
        expected_wait_hours=row.expected_wait_hours,
        available=row.available,
        simulated=row.simulated,
        interruption_basis=row.interruption_basis,
    )


def offering_values(off: Offering, refreshed_at: datetime, feed: str) -> dict[str, Any]:
    """The `offering` table's columns for one pool, as a plain dict for bulk upserts (no ORM object built)."""
    return {
        "key": off.key,
        "provider": off.provider,
        "region": off.region,
        "zone": off.zone,
        "instance_type": off.instance_type,
        "accelerator": off.accelerator,
        "accelerator_count": off.accelerator_count,
        "gpu_memory_gib": off.gpu_memory_gib,
        "vcpus": off.vcpus,
        "memory_gib": off.memory_gib,
        "capacity_type": off.capacity_type.value,
        "hourly_usd": off.price.hourly_usd,
        "price_source": off.price.source,
        "observed_at": off.price.observed_at,
        "estimated": off.price.estimated,
        "interruption_rate_per_hour": off.interruption_rate_per_hour,
        "egress_usd_per_gb": off.egress_usd_per_gb,
        "expected_wait_hours": off.expected_wait_hours,
        "available": off.available,
        "simulated": off.simulated,
        "interruption_basis": off.interruption_basis,
        "feed": feed,
        "refreshed_at": refreshed_at,
    }


class CatalogCache:
    """Per-process cache of the current PriceBook."""

    def __init__(self, engine: Engine, check_seconds: float = 2.0) -> None:
        self._engine = engine
        self._check_seconds = check_seconds
        self._book: PriceBook | None = None
        self._feed_of: dict[str, str] = {}
        self._version: datetime | None = None
        self._checked = 0.0
        self._lock = threading.Lock()

    def invalidate(self) -> None:
        """Force a reload on next use (this process just refreshed the table)."""
        with self._lock:
            self._book = None

    def feed_of(self, key: str) -> str:
        """The feed that wrote a pool's current price (as of the cached snapshot)."""
        return self._feed_of.get(key, "")

    def cached_book(self) -> PriceBook | None:
        """The book as `book()` would return it without touching the database, or None when `book()` would query
        (its re-check is due, nothing is loaded yet, or another thread is loading it). Never blocks: an event loop
        calls this, and `book()` in a worker thread only when it gets None."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            fresh = self._book is not None and time.monotonic() - self._checked < self._check_seconds
            return self._book if fresh else None
        finally:
            self._lock.release()

    def book(self, now: datetime) -> PriceBook:
        with self._lock:
            if self._book is not None and time.monotonic() - self._checked < self._check_seconds:
                return self._book
            with Session(self._engine) as session:
                version = session.exec(select(func.max(OfferingRow.refreshed_at))).one()
                if self._book is None or version != self._version:
                    rows = session.exec(select(OfferingRow)).all()
                    feeds = {
                        f.name: f.last_success_at
                        for f in session.exec(select(FeedStatus)).all()
                        if f.last_success_at is not None
                    }
                    self._book = PriceBook.build((offering_from_row(r) for r in rows), now, feeds)
                    self._feed_of = {r.key: r.feed for r in rows}
                    self._version = version
            self._checked = time.monotonic()
            return self._book
