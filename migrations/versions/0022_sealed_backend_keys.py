"""Backend API keys may be stored sealed (gateway/db/sealed.py): a sealed key is longer than
the key, so the column is text

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-07 00:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("backends") as batch:
        batch.alter_column("api_key", type_=sa.Text(), existing_type=sa.String(2048))


def downgrade() -> None:
    with op.batch_alter_table("backends") as batch:
        batch.alter_column("api_key", type_=sa.String(2048), existing_type=sa.Text())
