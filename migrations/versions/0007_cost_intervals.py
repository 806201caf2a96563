"""cost intervals and prompt prices: each record's and each rollup's 95% half-widths of
cost and baseline, and the $/1M prompt tokens a record's costs include

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02 06:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = ("cost_error_usd", "baseline_error_usd")


def upgrade() -> None:
    with op.batch_alter_table("usage_records") as batch:
        for name in COLUMNS:
            batch.add_column(sa.Column(name, sa.Double(), nullable=True))
        batch.add_column(sa.Column("prompt_usd_per_mtok", sa.Double(), nullable=True))
    with op.batch_alter_table("usage_hourly") as batch:
        for name in COLUMNS:
            batch.add_column(sa.Column(name, sa.Double(), nullable=False, server_default="0"))


def downgrade() -> None:
    for table in ("usage_hourly", "usage_records"):
        with op.batch_alter_table(table) as batch:
            for name in COLUMNS:
                batch.drop_column(name)
            if table == "usage_records":
                batch.drop_column("prompt_usd_per_mtok")
