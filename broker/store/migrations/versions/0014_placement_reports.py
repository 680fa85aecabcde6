"""placement_report and what the instance agent reported on each placement

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-27 20:00:00

`placement_report` holds one row per agent report the broker took, keyed by (placement, seq), so a report that
arrives twice (mailbox and callback, or a redelivery) is applied once. A placement records the outcome of its
`final` report, the work its durable checkpoint holds, its last report's time and an interruption notice's
deadline.
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

import broker.store.db

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "placement_report",
        sa.Column("placement_id", sqlmodel.sql.sqltypes.AutoString(length=40), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("kind", sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
        sa.Column("via", sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
        sa.Column("received_at", broker.store.db.UTCDateTime(timezone=True), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("placement_id", "seq"),
    )
    with op.batch_alter_table("placement", schema=None) as batch_op:
        batch_op.add_column(sa.Column("outcome", sqlmodel.sql.sqltypes.AutoString(length=16), nullable=True))
        batch_op.add_column(sa.Column("checkpointed_work_hours", broker.store.db.Money(length=40), nullable=True))
        batch_op.add_column(sa.Column("last_report_at", broker.store.db.UTCDateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("notice_deadline_at", broker.store.db.UTCDateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("placement", schema=None) as batch_op:
        batch_op.drop_column("notice_deadline_at")
        batch_op.drop_column("last_report_at")
        batch_op.drop_column("checkpointed_work_hours")
        batch_op.drop_column("outcome")
    op.drop_table("placement_report")
