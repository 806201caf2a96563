"""measurement sample: how many requests a measurement rests on, and their mean lengths

Curves weight points by their requests and keep apart points of very different answer
lengths. Rows written before it read NULL (weighted as one request, shape unknown).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02 02:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("measurements") as batch:
        batch.add_column(sa.Column("requests", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("mean_prompt_tokens", sa.Double(), nullable=True))
        batch.add_column(sa.Column("mean_output_tokens", sa.Double(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("measurements") as batch:
        batch.drop_column("mean_output_tokens")
        batch.drop_column("mean_prompt_tokens")
        batch.drop_column("requests")
