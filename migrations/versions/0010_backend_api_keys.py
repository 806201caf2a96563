"""backend api keys: the key a backend's vLLM server requires (`--api-key`), sent upstream

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03 08:10:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("backends") as batch:
        batch.add_column(sa.Column("api_key", sa.String(length=2048), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("backends") as batch:
        batch.drop_column("api_key")
