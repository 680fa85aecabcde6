"""Price operations outside the tick: importing catalog files into the catalog, forced refreshes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from sqlmodel import Session

from broker.loop.feeds import pool_experience, record_feed_status, store_offerings
from broker.runtime import Runtime
from pricing.catalog_import import import_catalog
from pricing.risk import apply_experience, apply_trace_priors


@dataclass(frozen=True)
class ImportSummary:
    path: Path
    feed: str
    offerings: int
    rows: int
    skipped: int
    price_changes: int
    warnings: list[str]


def import_catalog_files(
    rt: Runtime,
    paths: Sequence[Path],
    now: datetime,
    *,
    provider: str | None = None,
    on_file: Callable[[ImportSummary], None] | None = None,
) -> list[ImportSummary]:
    """Import SkyPilot-format catalogs; each file becomes the feed `catalog:<file name>` (re-importing a file
    replaces its pools and records only the prices that changed). A file that cannot be parsed raises
    `pricing.feeds.FeedError` and leaves what was stored before untouched."""
    out = []
    for path in paths:
        result = import_catalog(path, provider=provider, observed_at=now)
        feed = f"catalog:{path.name}"
        with Session(rt.engine) as session:
            # spot priors, as a live feed's: a configured trace replaces the catalog's, the broker's reclaims update it
            offerings = apply_experience(
                apply_trace_priors(result.offerings, rt.trace_priors), pool_experience(session, now)
            )
            changes = store_offerings(session, feed, offerings, now)
            record_feed_status(session, feed, now, len(result.offerings))
            session.commit()
        summary = ImportSummary(
            path, feed, len(result.offerings), result.rows, result.skipped, changes, result.warnings
        )
        out.append(summary)
        if on_file is not None:
            on_file(summary)
    rt.catalog.invalidate()
    return out
