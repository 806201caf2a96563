"""pools: a backend template and the DNS name whose addresses are its members; each
backend names the pool whose discovery added it

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-06 03:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "pools",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("dns_name", sa.String(length=255), nullable=False),
        sa.Column("port", sa.Integer(), nullable=False),
        sa.Column("scheme", sa.String(length=8), nullable=False),
        sa.Column("template", sa.JSON(), nullable=False),
        sa.Column("discovery_error", sa.String(length=500), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("port >= 1 AND port <= 65535", name=op.f("ck_pools_port_range")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_pools")),
        sa.UniqueConstraint("name", name=op.f("uq_pools_name")),
    )
    with op.batch_alter_table("backends") as batch:
        batch.add_column(sa.Column("pool", sa.String(length=200), nullable=True))
        batch.create_index(op.f("ix_backends_pool"), ["pool"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("backends") as batch:
        batch.drop_index(op.f("ix_backends_pool"))
        batch.drop_column("pool")
    op.drop_table("pools")
