"""Helpers shared by the loop's steps: row locking, upserts, the blocklist and the log context of a job."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlmodel import Session, SQLModel, col, select
from sqlmodel.sql.expression import SelectOfScalar

from broker.logging_setup import bind
from broker.tables import BlockEntry, Job, Placement

T = TypeVar("T", bound=SQLModel)


def locked(query: SelectOfScalar[T]) -> SelectOfScalar[T]:
    """Row-lock what the query returns, skipping rows another replica holds (PostgreSQL; a no-op on SQLite,
    where the database serialises writers and every step re-checks state in its UPDATE)."""
    return query.with_for_update(skip_locked=True)


def upsert(session: Session, model: type[SQLModel], rows: list[dict[str, Any]], keys: list[str]) -> None:
    """INSERT ... ON CONFLICT (keys) DO UPDATE on both backends, so concurrent refreshes never collide.

    Only the columns present in the rows are updated on conflict."""
    if not rows:
        return
    table = model.__table__  # type: ignore[attr-defined]
    dialect = session.get_bind().dialect.name
    stmt = (pg_insert if dialect == "postgresql" else sqlite_insert)(table).values(rows)
    updates = {name: stmt.excluded[name] for name in rows[0] if name not in keys}
    session.execute(stmt.on_conflict_do_update(index_elements=keys, set_=updates))


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


def block(session: Session, scope_key: str, until: datetime, reason: str) -> None:
    upsert(session, BlockEntry, [{"scope_key": scope_key, "until_at": until, "reason": reason}], ["scope_key"])


def active_blocklist(session: Session, now: datetime) -> frozenset[str]:
    rows = session.exec(select(BlockEntry.scope_key).where(col(BlockEntry.until_at) > now)).all()
    return frozenset(rows)


PREEMPTION_BLOCK = timedelta(minutes=30)
CAPACITY_BLOCK = timedelta(minutes=3)
QUOTA_BLOCK = timedelta(minutes=30)
AUTH_BLOCK = timedelta(hours=1)
