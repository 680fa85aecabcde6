"""Helpers shared by the loop's steps: row locking (one row, or a batch of placements with their jobs), upserts,
the blocklist and the log context of a job."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import ColumnElement, true
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm.exc import StaleDataError
from sqlmodel import Session, SQLModel, col, select
from sqlmodel.sql.expression import SelectOfScalar

from broker.observe.logging_setup import bind
from broker.services.jobs import add_event
from broker.store.tables import BlockEntry, Job, JobEvent, Placement
from providers.model import JobState, PlacementState

if TYPE_CHECKING:
    from broker.runtime import Runtime

T = TypeVar("T", bound=SQLModel)

log = logging.getLogger(__name__)


def locked(query: SelectOfScalar[T]) -> SelectOfScalar[T]:
    """Row-lock what the query returns, skipping rows another replica holds (PostgreSQL; a no-op on SQLite,
    where the database serialises writers and every step re-checks state in its UPDATE)."""
    return query.with_for_update(skip_locked=True)


def in_scope(rt: Runtime, placement_id: Any) -> ColumnElement[bool]:
    """SQL condition: the placement id (`placement_id`, a column) is in a shard this replica's tick holds
    (`broker.store.shards`); true when no tick scope is set (a step run on its own) or it holds every shard."""
    scope = rt.shards
    return true() if scope is None else scope.clause(placement_id)


def lock_batch(
    session: Session, ids: Sequence[str], keep: Callable[[Placement], bool]
) -> tuple[list[Placement], dict[str, Job]]:
    """Lock a batch of placements and their jobs for one transaction: the placements in id order, skipping rows
    another replica holds, then (of those `keep` accepts) their jobs, also in id order. Every step that locks
    several jobs at once takes them in that one order, so two replicas' batches can never wait on each other in a
    cycle. Returns the kept placements and their jobs by id."""
    placements = [
        p
        for p in session.exec(
            locked(select(Placement).where(col(Placement.id).in_(ids)).order_by(col(Placement.id)))
        ).all()
        if keep(p)
    ]
    if not placements:
        return [], {}
    job_ids = sorted({p.job_id for p in placements})
    jobs = session.exec(select(Job).where(col(Job.id).in_(job_ids)).order_by(col(Job.id)).with_for_update()).all()
    return placements, {j.id: j for j in jobs}


# a placement whose instance is (or may soon be) running: launched, queued at its provider, or running
LIVE_STATES = (PlacementState.LAUNCHING.value, PlacementState.QUEUED.value, PlacementState.RUNNING.value)


def lock_running(session: Session, pid: str, live: Sequence[str] = LIVE_STATES) -> tuple[Placement, Job] | None:
    """Placement `pid` and its job, row-locked in that order, when the placement is in one of the `live` states
    with an instance and is its running job's current one; None when it is not (or another replica holds it).
    For a step that decided on an unlocked snapshot and now acts on one placement."""
    p = session.exec(locked(select(Placement).where(Placement.id == pid))).first()
    if p is None or p.state not in live or p.instance_id is None:
        return None
    job = session.exec(select(Job).where(Job.id == p.job_id).with_for_update()).one()
    if job.state != JobState.RUNNING.value or job.current_placement_id != p.id:
        return None
    return p, job


def commit_unless_raced(session: Session, what: str) -> bool:
    """Commit the step's writes on one job; False, with everything rolled back, when a conditional write found a
    job's or placement's state changed since it was read (`StaleDataError`: a cancel, a PATCH or another step
    committed first; broker/store/tables.py). The row is then the next look's: the step goes on with the others."""
    try:
        session.commit()
    except StaleDataError:
        session.rollback()
        log.info("%s: its state changed meanwhile; left to the next look", what)
        return False
    return True


def upsert(session: Session, model: type[SQLModel], rows: list[dict[str, Any]], keys: list[str]) -> None:
    """INSERT ... ON CONFLICT (keys) DO UPDATE on both backends, so concurrent refreshes never collide.

    Every row must have the columns of the first; only those columns are updated on conflict. The statement is
    built once per column set and sent as one executemany (the driver batches the rows), so its compiled form is
    cached and reused instead of compiling one multi-row VALUES clause per call."""
    if not rows:
        return
    table = model.__table__  # type: ignore[attr-defined]
    dialect = session.get_bind().dialect.name
    stmt = (pg_insert if dialect == "postgresql" else sqlite_insert)(table)
    updates = {name: stmt.excluded[name] for name in rows[0] if name not in keys}
    session.execute(stmt.on_conflict_do_update(index_elements=keys, set_=updates), rows)


def bind_job(job: Job | None, placement: Placement | None = None) -> None:
    """Log context for work on one job (and placement) until the step ends: ids, provider, offering, and the
    request that submitted the job. `bind_job(None)` clears it (at the top of each loop iteration)."""
    bind(
        job_id=job.id if job else (placement.job_id if placement else None),
        request_id=job.request_id if job else None,
        placement_id=placement.id if placement else None,
        provider=placement.provider if placement else None,
        offering=placement.offering_key if placement else None,
    )


def event_once(session: Session, job: Job, p: Placement, now: datetime, kind: str, message: str) -> None:
    """Add a `kind` event for placement `p` unless the job already has one for it (a step that waits for a
    placement's next checkpoint says so once, not on every tick)."""
    earlier = session.exec(select(JobEvent.data).where(JobEvent.job_id == job.id, JobEvent.kind == kind)).all()
    if not any(data.get("placement_id") == p.id for data in earlier):
        add_event(session, job, now, kind, message, placement_id=p.id)


def block(session: Session, scope_key: str, until: datetime, reason: str) -> None:
    upsert(session, BlockEntry, [{"scope_key": scope_key, "until_at": until, "reason": reason}], ["scope_key"])


def active_blocklist(session: Session, now: datetime) -> frozenset[str]:
    rows = session.exec(select(BlockEntry.scope_key).where(col(BlockEntry.until_at) > now)).all()
    return frozenset(rows)


PREEMPTION_BLOCK = timedelta(minutes=30)
CAPACITY_BLOCK = timedelta(minutes=3)
QUOTA_BLOCK = timedelta(minutes=30)
AUTH_BLOCK = timedelta(hours=1)
