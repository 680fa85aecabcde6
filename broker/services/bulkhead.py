"""Bulkheads for the tick steps: one bad item (a placement, a mailbox entry, a feed, a report run, a delivery) is
reported and skipped, never a stopped step, and an item that keeps failing is quarantined, not retried forever.

A step opens one `Bulkhead` for its run (`with bulkhead(rt, "sync_instances", now) as bh:`) and wraps the work on
each item in `with bh.item(key, record=...):`. An exception out of that block (any `Exception`: the expected ones
each step handles itself, as before) is caught there and:
- logged with the step and the item's key (and the job's log context the step bound);
- counted, `overspill_tick_item_errors_total{step}` (`broker.observe.metrics`);
- recorded on the item by the step's `record(exc, quarantined)` callback (an event on the job, the entry moved
  aside, the feed's `last_error`), itself guarded: a failing record is logged, never raised;
- counted against the item in `tick_item_failure` (`broker.store.tables.TickItemFailure`, written when the step's
  bulkhead closes, after the step's own transactions, so a step holding SQLite's write lock never waits on itself).
  When an item has failed `tick_item_quarantine_after` ticks in a row (a setting) it is quarantined: `bh.skip(key)`
  is then true and the step leaves it alone until an operator deletes its row; the record callback is told, so the
  item shows it (the job's `quarantined` event, the entry moved to `quarantine/`). An item that succeeds again has
  its row deleted.
A step that works in a database transaction runs each item in a savepoint (`session.begin_nested()`) inside the
`item` block, so a failed item undoes its own changes only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import delete
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlmodel import Session, col, select

from broker.runtime import Runtime
from broker.services.jobs import add_event
from broker.store.tables import Job, TickItemFailure

log = logging.getLogger(__name__)

Record = Callable[[BaseException, bool], None]


@dataclass
class Bulkhead:
    """One step's per-item guard for one run (see the module docstring)."""

    rt: Runtime
    step: str
    now: datetime
    known: dict[str, TickItemFailure] = field(default_factory=dict)
    failed: dict[str, tuple[int, str, bool]] = field(default_factory=dict)  # key -> (failures, error, quarantined)
    succeeded: set[str] = field(default_factory=set)

    def skip(self, key: str) -> bool:
        """True when the item is quarantined in this step (left alone until an operator releases it)."""
        row = self.known.get(key)
        return row is not None and row.quarantined_at is not None

    @property
    def quarantined(self) -> frozenset[str]:
        return frozenset(k for k, row in self.known.items() if row.quarantined_at is not None)

    @contextmanager
    def item(
        self, key: str, record: Record | None = None, passes: tuple[type[BaseException], ...] = ()
    ) -> Iterator[None]:
        """Guard the work on one item: an exception inside is caught, logged, counted and recorded, but for those
        of the `passes` types (the failures the step expects and handles itself), which go on up unchanged."""
        try:
            yield
        except passes:
            raise
        except Exception as exc:  # the bulkhead: one item's failure never stops the step
            self.failure(key, exc, record)
        else:
            if key in self.known and key not in self.failed:
                self.succeeded.add(key)

    def failure(self, key: str, exc: BaseException, record: Record | None = None) -> None:
        """Count a failure of `key` (for steps that catch the exception themselves)."""
        before = self.known.get(key)
        failures = (before.failures if before is not None else 0) + 1
        quarantined = failures >= self.rt.settings.tick_item_quarantine_after
        error = f"{type(exc).__name__}: {exc}"[:1000]
        self.failed[key] = (failures, error, quarantined)
        self.succeeded.discard(key)
        log.error(
            "tick step %s failed on item %s (%d tick(s) in a row%s): %s",
            self.step,
            key,
            failures,
            "; quarantined" if quarantined else "",
            error,
            exc_info=exc,
            extra={"step": self.step, "item": key},
        )
        self.rt.metrics.item_errors.labels(self.step).inc()
        if quarantined:
            self.rt.metrics.items_quarantined.labels(self.step).inc()
        if record is not None:
            try:
                record(exc, quarantined)
            except Exception:  # recording must not undo the bulkhead
                log.exception("recording the failure of %s on item %s failed", self.step, key)

    def close(self) -> None:
        """Write the failure counts (and delete the rows of items that succeeded again)."""
        if not self.failed and not self.succeeded:
            return
        with Session(self.rt.engine) as session:
            rows = []
            for key, (failures, error, quarantined) in self.failed.items():
                before = self.known.get(key)
                rows.append(
                    {
                        "step": self.step,
                        "item": key[:400],
                        "failures": failures,
                        "last_error": error,
                        "first_at": before.first_at if before is not None else self.now,
                        "last_at": self.now,
                        "quarantined_at": self.now if quarantined else None,
                    }
                )
            _upsert(session, rows)
            if self.succeeded:
                session.execute(
                    delete(TickItemFailure).where(
                        col(TickItemFailure.step) == self.step, col(TickItemFailure.item).in_(sorted(self.succeeded))
                    )
                )
            session.commit()


def _upsert(session: Session, rows: list[dict[str, object]]) -> None:
    table = TickItemFailure.__table__  # type: ignore[attr-defined]
    dialect = session.get_bind().dialect.name
    stmt = (pg_insert if dialect == "postgresql" else sqlite_insert)(table)
    updates = {name: stmt.excluded[name] for name in rows[0] if name not in ("step", "item")}
    session.execute(stmt.on_conflict_do_update(index_elements=["step", "item"], set_=updates), rows)


@contextmanager
def bulkhead(rt: Runtime, step: str, now: datetime) -> Iterator[Bulkhead]:
    """A `Bulkhead` for one run of `step`, with the items that failed before (one read); their counts are written
    when the block ends, whether the step finished or raised."""
    with Session(rt.engine) as session:
        known = {r.item: r for r in session.exec(select(TickItemFailure).where(TickItemFailure.step == step)).all()}
    bh = Bulkhead(rt, step, now, known)
    try:
        yield bh
    finally:
        try:
            bh.close()
        except Exception:  # the database away: the counts are kept from the next failure on
            log.exception("writing the item failures of step %s failed", step)


def job_event(session: Session, job: Job, step: str, now: datetime, **data: object) -> Record:
    """A `record` callback that adds to `job` (a row in `session`, which the step commits) a `tick_item_failed`
    event, or `quarantined` once the item is, with the error."""

    def record(exc: BaseException, quarantined: bool) -> None:
        if quarantined:
            kind, what = "quarantined", f"quarantined: the {step} step failed on it tick after tick and leaves it alone"
        else:
            kind, what = "tick_item_failed", f"the {step} step failed on it this tick and went on with the others"
        add_event(session, job, now, kind, f"{what}: {type(exc).__name__}: {exc}"[:1000], step=step, **data)

    return record


def job_event_after(rt: Runtime, job_id: str, step: str, now: datetime, **data: object) -> Record:
    """`job_event` for a step that holds no transaction when an item fails (its own sessions are closed): the
    event is written in a session of its own."""

    def record(exc: BaseException, quarantined: bool) -> None:
        with Session(rt.engine) as session:
            job = session.get(Job, job_id)
            if job is not None:
                job_event(session, job, step, now, **data)(exc, quarantined)
                session.commit()

    return record
