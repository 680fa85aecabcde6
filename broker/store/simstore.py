"""Database-backed store for the built-in simulated clouds, so they behave like external systems: their
instances outlive a broker crash and every replica sees the same ones."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from sqlalchemy import select as sa_select
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, select

from broker.store.bulk import among
from broker.store.tables import SimInstanceRow
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
    """Implements `providers.simulated.store.SimStore` on the broker's database.

    A record's columns other than `terminated_at` never change once inserted, so `get_many` (a tick reads every
    live instance) keeps each record it read and afterwards reads only `(instance_id, launch_token,
    terminated_at)` of known instances: no JSON parsed per instance per tick. Every read still goes to the
    database, so an instance another replica terminated or a token that changed is seen at once."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._known: dict[tuple[str, str], SimRecord] = {}  # (provider, instance_id) -> the record last read

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
        """Plain rows, no ORM object per instance; of the instances read before only the columns that can change."""
        out: list[SimRecord] = []
        ids = list(instance_ids)
        if len(self._known) > 2 * len(ids) + 100_000:  # bounded: mostly instances long gone
            self._known.clear()
        table = SimInstanceRow.__table__  # type: ignore[attr-defined]
        with self._engine.connect() as conn:
            # PostgreSQL: every id in one array parameter (an IN list costs the driver a placeholder per id);
            # elsewhere bounded IN lists
            size = (len(ids) or 1) if conn.dialect.name == "postgresql" else 1000
            for start in range(0, len(ids), size):
                chunk = ids[start : start + size]
                where = (table.c.provider == provider, among(conn, table.c.instance_id, chunk))
                missing = []
                for iid, token, terminated in conn.execute(
                    sa_select(table.c.instance_id, table.c.launch_token, table.c.terminated_at).where(*where)
                ).all():  # fetched at once (iterating the result fetches row by row)
                    known = self._known.get((provider, iid))
                    if known is None or known.launch_token != token:
                        missing.append(iid)
                    elif known.terminated_at != terminated:
                        out.append(self._keep(replace(known, terminated_at=terminated)))
                    else:
                        out.append(known)
                if missing:
                    rows = conn.execute(
                        sa_select(table).where(table.c.provider == provider, among(conn, table.c.instance_id, missing))
                    )
                    out.extend(self._keep(_record(r)) for r in rows)
        return out

    def _keep(self, record: SimRecord) -> SimRecord:
        self._known[(record.provider, record.instance_id)] = record
        return record

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
