"""Database-backed store for the built-in simulated clouds, so they behave like external systems: their
instances outlive a broker crash and every replica sees the same ones."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import select as sa_select
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, select

from broker.tables import SimInstanceRow
from providers.simulated.store import SimRecord


def _record(row: Any) -> SimRecord:
    """A `SimInstanceRow` or a plain row of its table."""
    return SimRecord(
        provider=row.provider,
        launch_token=row.launch_token,
        instance_id=row.instance_id,
        offering_key=row.offering_key,
        launched_at=row.launched_at,
        data=dict(row.data),
        terminated_at=row.terminated_at,
    )


class DbSimStore:
    """Implements `providers.simulated.store.SimStore` on the broker's database."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def insert_if_absent(self, record: SimRecord) -> SimRecord:
        with Session(self._engine) as session:
            existing = session.get(SimInstanceRow, (record.provider, record.launch_token))
            if existing is not None:
                return _record(existing)
            session.add(
                SimInstanceRow(
                    provider=record.provider,
                    launch_token=record.launch_token,
                    instance_id=record.instance_id,
                    offering_key=record.offering_key,
                    launched_at=record.launched_at,
                    data=record.data,
                    terminated_at=record.terminated_at,
                )
            )
            try:
                session.commit()
            except IntegrityError:
                session.rollback()
                row = session.get(SimInstanceRow, (record.provider, record.launch_token))
                assert row is not None
                return _record(row)
        return record

    def get(self, provider: str, instance_id: str) -> SimRecord | None:
        with Session(self._engine) as session:
            row = session.exec(
                select(SimInstanceRow).where(
                    SimInstanceRow.provider == provider, SimInstanceRow.instance_id == instance_id
                )
            ).first()
            return _record(row) if row else None

    def get_many(self, provider: str, instance_ids: Sequence[str]) -> list[SimRecord]:
        """Plain rows, no ORM object per instance (a tick reads every live instance this way)."""
        out: list[SimRecord] = []
        ids = list(instance_ids)
        table = SimInstanceRow.__table__  # type: ignore[attr-defined]
        with self._engine.connect() as conn:
            for start in range(0, len(ids), 1000):  # bounded IN lists
                chunk = ids[start : start + 1000]
                rows = conn.execute(
                    sa_select(table).where(table.c.provider == provider, table.c.instance_id.in_(chunk))
                )
                out.extend(_record(r) for r in rows)
        return out

    def mark_terminated(self, provider: str, instance_id: str, at: datetime) -> None:
        with Session(self._engine) as session:
            row = session.exec(
                select(SimInstanceRow).where(
                    SimInstanceRow.provider == provider, SimInstanceRow.instance_id == instance_id
                )
            ).first()
            if row is not None and row.terminated_at is None:
                row.terminated_at = at
                session.add(row)
                session.commit()

    def list(self, provider: str) -> list[SimRecord]:
        with Session(self._engine) as session:
            rows = session.exec(
                select(SimInstanceRow)
                .where(SimInstanceRow.provider == provider)
                .order_by(SimInstanceRow.launched_at, SimInstanceRow.launch_token)
            ).all()
            return [_record(r) for r in rows]
