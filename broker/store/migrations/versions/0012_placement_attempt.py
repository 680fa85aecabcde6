"""placement.attempt_uri and placement.user_data: the instance agent's attempt

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02 09:00:00

A placement on a cloud whose instances run the agent records where its attempt lives in the checkpoint store
(`attempt_uri`: the spec, then the logs) and the start-up script it was launched with (`user_data`, rendered once so
a retried launch sends the same bytes). Both are NULL for providers that run no agent.
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("placement", schema=None) as batch_op:
        batch_op.add_column(sa.Column("attempt_uri", sqlmodel.sql.sqltypes.AutoString(length=1024), nullable=True))
        batch_op.add_column(sa.Column("user_data", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("placement", schema=None) as batch_op:
        batch_op.drop_column("user_data")
        batch_op.drop_column("attempt_uri")
