"""availability history of spot pools

Revision ID: 0004
Revises: 0003
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

import broker.store.db

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "availability_change",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("offering_key", sqlmodel.sql.sqltypes.AutoString(length=200), nullable=False),
        sa.Column("up", sa.Boolean(), nullable=False),
        sa.Column("observed_at", broker.store.db.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("availability_change", schema=None) as batch_op:
        batch_op.create_index("ix_availability_change_key_at", ["offering_key", "observed_at"], unique=False)


def downgrade() -> None:
    op.drop_table("availability_change")
