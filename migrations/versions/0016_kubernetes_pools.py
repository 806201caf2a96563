"""pools found through the Kubernetes API: a Service (and its namespace) in place of a DNS
name

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-06 06:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("pools") as batch:
        batch.alter_column("dns_name", existing_type=sa.String(length=255), nullable=True)
        batch.add_column(sa.Column("service", sa.String(length=63), nullable=True))
        batch.add_column(sa.Column("namespace", sa.String(length=63), nullable=True))
        batch.create_check_constraint(
            op.f("ck_pools_one_source"), "(dns_name IS NULL) <> (service IS NULL)"
        )


def downgrade() -> None:
    op.execute("DELETE FROM pools WHERE dns_name IS NULL")
    with op.batch_alter_table("pools") as batch:
        batch.drop_constraint(op.f("ck_pools_one_source"), type_="check")
        batch.drop_column("namespace")
        batch.drop_column("service")
        batch.alter_column("dns_name", existing_type=sa.String(length=255), nullable=False)
