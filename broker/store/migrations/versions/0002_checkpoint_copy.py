"""checkpoint copy state and staging leases

Revision ID: 0002
Revises: 0001
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

import broker.store.db

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "checkpoint_copy",
        sa.Column("copy_id", sqlmodel.sql.sqltypes.AutoString(length=80), nullable=False),
        sa.Column("state", sa.JSON(), nullable=True),
        sa.Column("lease_owner", sqlmodel.sql.sqltypes.AutoString(length=80), nullable=True),
        sa.Column("lease_until_at", broker.store.db.UTCDateTime(timezone=True), nullable=True),
        sa.Column("updated_at", broker.store.db.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("copy_id"),
    )


def downgrade() -> None:
    op.drop_table("checkpoint_copy")
