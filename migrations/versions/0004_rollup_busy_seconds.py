"""rollup busy seconds: the sum of request latencies per hourly rollup row

Over the hour's 3600 s it is the mean number of requests in flight (Little's law), the
traffic figure right-sized fleets are computed from. Rows written before it read 0.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 23:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("usage_hourly") as batch:
        batch.add_column(sa.Column("busy_s", sa.Double(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("usage_hourly") as batch:
        batch.drop_column("busy_s")
