"""tick_shard and tick_replica: shard leases that partition live placements among tick replicas

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-27 23:00:00

`tick_shard` holds one row per shard (`broker.store.shards.SHARDS` of them, created on first use) with the lease's owner
and expiry; `tick_replica` one heartbeat row per tick replica. Neither holds state a crash could lose: leases only
decide which replica does the per-placement work, never whether it is done once (row locks decide that).
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

import broker.store.db

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "tick_shard",
        sa.Column("shard", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("owner", sqlmodel.sql.sqltypes.AutoString(length=80), nullable=True),
        sa.Column("until_at", broker.store.db.UTCDateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("shard"),
    )
    op.create_table(
        "tick_replica",
        sa.Column("replica_id", sqlmodel.sql.sqltypes.AutoString(length=80), nullable=False),
        sa.Column("seen_at", broker.store.db.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("replica_id"),
    )


def downgrade() -> None:
    op.drop_table("tick_replica")
    op.drop_table("tick_shard")
