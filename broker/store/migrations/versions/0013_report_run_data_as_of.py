"""report runs keep their data's "as of" time

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27 09:00:00

`report_run.data_as_of` is the ledger's latest accrued time in the run's period (the latest end of its entries;
null without entries): what the report file says its data is "as of", kept so that the run list can title a
month-to-date run as its file does ("1-25 November 2026 (month to date)") without reading the file.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import broker.store.db

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("report_run", schema=None) as batch_op:
        batch_op.add_column(sa.Column("data_as_of", broker.store.db.UTCDateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("report_run", schema=None) as batch_op:
        batch_op.drop_column("data_as_of")
