"""usage_records.response_id: the Responses API id of what a backend stored, so a chained
turn (`previous_response_id`) goes to the backend that holds it

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-06 07:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("usage_records") as batch:
        batch.add_column(sa.Column("response_id", sa.String(length=128), nullable=True))
        batch.create_index(op.f("ix_usage_records_response_id"), ["response_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("usage_records") as batch:
        batch.drop_index(op.f("ix_usage_records_response_id"))
        batch.drop_column("response_id")
