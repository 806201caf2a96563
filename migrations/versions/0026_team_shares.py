"""Fair share and priority: each team's weight in a full model's queue and its requests'
priority; each backend's scheduling policy (its server's, which takes a priority or not)

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-07 23:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0026"
down_revision: str | None = "0025"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("teams") as batch:
        batch.add_column(sa.Column("weight", sa.Double(), nullable=False, server_default="1"))
        batch.add_column(sa.Column("priority", sa.Integer(), nullable=False, server_default="0"))
    with op.batch_alter_table("backends") as batch:
        batch.add_column(
            sa.Column("scheduling", sa.String(length=16), nullable=False, server_default="fcfs")
        )


def downgrade() -> None:
    with op.batch_alter_table("backends") as batch:
        batch.drop_column("scheduling")
    with op.batch_alter_table("teams") as batch:
        batch.drop_column("priority")
        batch.drop_column("weight")
