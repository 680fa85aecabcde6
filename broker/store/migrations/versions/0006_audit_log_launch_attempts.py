"""audit log of state-changing requests; launch attempts per placement

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-22 08:10:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

import broker.store.db

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "audit_log",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("at", broker.store.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("tenant", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("key_id", sqlmodel.sql.sqltypes.AutoString(length=32), nullable=False),
        sa.Column("role", sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
        sa.Column("method", sqlmodel.sql.sqltypes.AutoString(length=8), nullable=False),
        sa.Column("path", sqlmodel.sql.sqltypes.AutoString(length=500), nullable=False),
        sa.Column("route", sqlmodel.sql.sqltypes.AutoString(length=200), nullable=False),
        sa.Column("status", sa.Integer(), nullable=False),
        sa.Column("client", sqlmodel.sql.sqltypes.AutoString(length=100), nullable=False),
        sa.Column("request_id", sqlmodel.sql.sqltypes.AutoString(length=128), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.create_index("ix_audit_log_tenant_id", ["tenant", "id"], unique=False)
    with op.batch_alter_table("placement", schema=None) as batch_op:
        batch_op.add_column(sa.Column("launch_attempts", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("placement", schema=None) as batch_op:
        batch_op.drop_column("launch_attempts")
    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.drop_index("ix_audit_log_tenant_id")
    op.drop_table("audit_log")
