"""job.request_id: the id of the HTTP request that submitted the job, carried into the control loop's logs

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-22 07:50:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.add_column(sa.Column("request_id", sqlmodel.sql.sqltypes.AutoString(length=128), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.drop_column("request_id")
