"""tokens estimated: a record whose token counts the gateway estimated (a non-streamed
request its client left before the backend answered) rather than read from the backend

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02 14:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("usage_records") as batch:
        batch.add_column(
            sa.Column("tokens_estimated", sa.Boolean(), nullable=False, server_default=sa.false())
        )


def downgrade() -> None:
    with op.batch_alter_table("usage_records") as batch:
        batch.drop_column("tokens_estimated")
