"""Checkpoint-copy state in the broker's database: a `CopyStateStore` that survives restarts and is shared by
replicas, and a lease so that only one replica stages a given placement's checkpoint at a time.

Contract of `DbCopyStateStore`: as `providers.storage.state.CopyStateStore` (save durable on return, load the last
save, delete converges). `claim_lease(engine, name, owner, until, now)` returns True when `owner` holds the lease
`name` until `until` (it was free, expired, or already its own), False when another owner holds it; `release_lease`
gives it up. Both are single conditional statements, so two replicas racing for a lease cannot both win.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import or_, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col

from broker.store.db import utcnow
from broker.store.tables import CheckpointCopyRow
from providers.storage.state import CopyState


class DbCopyStateStore:
    """Copy resume states in the `checkpoint_copy` table."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def load(self, copy_id: str) -> CopyState | None:
        with Session(self.engine) as session:
            row = session.get(CheckpointCopyRow, copy_id)
            return CopyState.from_json(row.state) if row is not None and row.state else None

    def save(self, copy_id: str, state: CopyState) -> None:
        with Session(self.engine) as session:
            row = session.get(CheckpointCopyRow, copy_id) or CheckpointCopyRow(copy_id=copy_id, updated_at=utcnow())
            row.state = state.to_json()
            row.updated_at = utcnow()
            session.add(row)
            session.commit()

    def delete(self, copy_id: str) -> None:
        with Session(self.engine) as session:
            row = session.get(CheckpointCopyRow, copy_id)
            if row is not None:
                session.delete(row)
                session.commit()


def claim_lease(engine: Engine, name: str, owner: str, until: datetime, now: datetime) -> bool:
    """Take or extend the lease `name` for `owner`; False while another owner's lease is still running."""
    with Session(engine) as session:
        taken = session.execute(
            update(CheckpointCopyRow)
            .where(
                col(CheckpointCopyRow.copy_id) == name,
                or_(
                    col(CheckpointCopyRow.lease_owner).is_(None),
                    col(CheckpointCopyRow.lease_owner) == owner,
                    col(CheckpointCopyRow.lease_until_at) <= now,
                ),
            )
            .values(lease_owner=owner, lease_until_at=until, updated_at=now)
        ).rowcount
        session.commit()
        if taken:
            return True
        if session.get(CheckpointCopyRow, name) is not None:
            return False  # the row exists and someone else holds it
        session.add(CheckpointCopyRow(copy_id=name, lease_owner=owner, lease_until_at=until, updated_at=now))
        try:
            session.commit()
        except IntegrityError:  # another replica inserted it first
            return False
        return True


def release_lease(engine: Engine, name: str, owner: str) -> None:
    """Drop the lease row if `owner` still holds it."""
    with Session(engine) as session:
        row = session.get(CheckpointCopyRow, name)
        if row is not None and row.lease_owner == owner:
            session.delete(row)
            session.commit()
