"""ledger ids: a gateway-made unique id per record, the client's x-request-id beside it

The client's id alone cannot be the ledger's key: a client reusing it would be recorded
once. Also widens `outcome` to hold `client_disconnect`.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29 11:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("usage_records") as batch:
        batch.add_column(sa.Column("client_request_id", sa.String(length=64), nullable=True))
        batch.alter_column(
            "outcome", existing_type=sa.String(length=16), type_=sa.String(length=32)
        )
        batch.create_index(
            batch.f("ix_usage_records_client_request_id"), ["client_request_id"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("usage_records") as batch:
        batch.drop_index(batch.f("ix_usage_records_client_request_id"))
        batch.alter_column(
            "outcome", existing_type=sa.String(length=32), type_=sa.String(length=16)
        )
        batch.drop_column("client_request_id")
