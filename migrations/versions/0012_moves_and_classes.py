"""gradual method moves and request classes: where a pinned model's traffic is moving from,
since when, in steps; per-class objectives of a policy; an API key's request class

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03 14:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("models") as batch:
        batch.add_column(sa.Column("move", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("classes", sa.JSON(), nullable=True))
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("request_class", sa.String(32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("request_class")
    with op.batch_alter_table("models") as batch:
        batch.drop_column("classes")
        batch.drop_column("move")
