"""cached prompt tokens: each record's prompt tokens read from the backend's prefix cache
(NULL when it did not say), and each rollup's sum of them with the prefill they skipped at
the prompt prices the records were given

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-05 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("usage_records") as batch:
        batch.add_column(sa.Column("cached_prompt_tokens", sa.Integer(), nullable=True))
    with op.batch_alter_table("usage_hourly") as batch:
        batch.add_column(
            sa.Column("cached_prompt_tokens", sa.BigInteger(), nullable=False, server_default="0")
        )
        batch.add_column(
            sa.Column("prefill_saved_by_cache_usd", sa.Double(), nullable=False, server_default="0")
        )


def downgrade() -> None:
    with op.batch_alter_table("usage_hourly") as batch:
        batch.drop_column("prefill_saved_by_cache_usd")
        batch.drop_column("cached_prompt_tokens")
    with op.batch_alter_table("usage_records") as batch:
        batch.drop_column("cached_prompt_tokens")
