"""Each request's own speculative decoding where the engine reports it (vLLM's per-request
spec decode metrics): verify steps, draft tokens proposed and accepted, on usage records
and summed in the hourly rollups

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-06 16:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = ("spec_steps", "draft_tokens", "accepted_tokens")


def upgrade() -> None:
    with op.batch_alter_table("usage_records") as batch:
        for name in COLUMNS:
            batch.add_column(sa.Column(name, sa.Integer(), nullable=True))
    with op.batch_alter_table("usage_hourly") as batch:
        for name in COLUMNS:
            batch.add_column(sa.Column(name, sa.BigInteger(), nullable=False, server_default="0"))


def downgrade() -> None:
    for table in ("usage_hourly", "usage_records"):
        with op.batch_alter_table(table) as batch:
            for name in COLUMNS:
                batch.drop_column(name)
