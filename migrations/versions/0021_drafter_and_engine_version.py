"""Drafters and engine versions are dimensions: each backend's vLLM version (read from its
`/version`), and the drafter and engine version each measurement was taken with, so a
drafter or engine upgrade does not mix old and new prices in one curve

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-07 00:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("backends") as batch:
        batch.add_column(sa.Column("engine_version", sa.String(64), nullable=True))
    with op.batch_alter_table("measurements") as batch:
        batch.add_column(sa.Column("drafter", sa.String(500), nullable=True))
        batch.add_column(sa.Column("engine_version", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("measurements") as batch:
        batch.drop_column("engine_version")
        batch.drop_column("drafter")
    with op.batch_alter_table("backends") as batch:
        batch.drop_column("engine_version")
