"""rate windows: per-key request and token counts per minute, shared by replicas

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 10:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "rate_windows",
        sa.Column("api_key_id", sa.Integer(), nullable=False),
        sa.Column("window_start", sa.BigInteger(), nullable=False),
        sa.Column("requests", sa.Integer(), nullable=False),
        sa.Column("tokens", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("api_key_id", "window_start", name=op.f("pk_rate_windows")),
    )


def downgrade() -> None:
    op.drop_table("rate_windows")
