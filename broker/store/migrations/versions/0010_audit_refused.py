"""refused requests counted per minute, address, route and status (never per tenant)

Revision ID: 0010
Revises: 0007
Create Date: 2026-11-25 18:00:00

Unauthenticated and refused state-changing requests used to append one `audit_log` row each, filed under the
tenant of whatever key id they named: anyone could fill a tenant's audit log. They are counted here instead.
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

import broker.store.db

revision: str = "0010"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "audit_refused",
        sa.Column("minute", broker.store.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("client", sqlmodel.sql.sqltypes.AutoString(length=100), nullable=False),
        sa.Column("method", sqlmodel.sql.sqltypes.AutoString(length=8), nullable=False),
        sa.Column("route", sqlmodel.sql.sqltypes.AutoString(length=200), nullable=False),
        sa.Column("status", sa.Integer(), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("last_at", broker.store.db.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("minute", "client", "method", "route", "status"),
    )


def downgrade() -> None:
    op.drop_table("audit_refused")
