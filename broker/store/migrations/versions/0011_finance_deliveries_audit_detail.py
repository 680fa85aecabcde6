"""report runs delivered by the control loop (destination, delivery state and attempts); audit detail

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-26 09:00:00

A report run keeps where it goes: a request renders the report and answers, the tick delivers it (a request never
waits on a third party). `audit_log.detail` holds what a route chose to record beyond method and path, such as a
ledger correction's entry, amount and job.
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("report_run", schema=None) as batch_op:
        batch_op.add_column(sa.Column("destination", sa.JSON(), nullable=False, server_default="{}"))
        batch_op.add_column(
            sa.Column("delivery_state", sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False, server_default="")
        )
        batch_op.add_column(sa.Column("delivery_attempts", sa.Integer(), nullable=False, server_default="0"))
        batch_op.create_index("ix_report_run_delivery_state", ["delivery_state"], unique=False)
    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("detail", sqlmodel.sql.sqltypes.AutoString(length=500), nullable=False, server_default="")
        )


def downgrade() -> None:
    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.drop_column("detail")
    with op.batch_alter_table("report_run", schema=None) as batch_op:
        batch_op.drop_index("ix_report_run_delivery_state")
        batch_op.drop_column("delivery_attempts")
        batch_op.drop_column("delivery_state")
        batch_op.drop_column("destination")
