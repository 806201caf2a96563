"""leases: a job one gateway replica does for all (pool discovery), and until when

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-06 15:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "leases",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("holder", sa.String(length=200), nullable=False),
        sa.Column("expires_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_leases")),
    )


def downgrade() -> None:
    op.drop_table("leases")
