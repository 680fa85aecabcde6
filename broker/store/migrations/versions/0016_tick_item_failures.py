"""tick_item_failure: the items a tick step failed on, ticks in a row, and the ones quarantined

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-07 15:30:00

One row per (step, item) that raised in its step (`broker.services.bulkhead`); deleted once the item succeeds again.
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

import broker.store.db

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "tick_item_failure",
        sa.Column("step", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("item", sqlmodel.sql.sqltypes.AutoString(length=400), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("last_error", sqlmodel.sql.sqltypes.AutoString(length=1000), nullable=False),
        sa.Column("first_at", broker.store.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("last_at", broker.store.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("quarantined_at", broker.store.db.UTCDateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("step", "item"),
    )


def downgrade() -> None:
    op.drop_table("tick_item_failure")
