"""shared rate-limit buckets

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24 09:00:00

UNLOGGED on PostgreSQL: a bucket is not worth a WAL record (a crash or a failover empties the table, which only
gives every key a full bucket again), and a take then never waits for a disk flush. WITHOUT ROWID on SQLite: the
primary key is the only way rows are found.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    op.create_table(
        "rate_limit_bucket",
        sa.Column("key", sa.LargeBinary(), nullable=False),
        sa.Column("tat", sa.Float(), nullable=False),
        sa.Column("wait", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("key"),
        prefixes=["UNLOGGED"] if postgres else [],
        sqlite_with_rowid=False,
    )


def downgrade() -> None:
    op.drop_table("rate_limit_bucket")
