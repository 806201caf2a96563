"""lossless checks: each served answer compared with its replay on the reference method;
a key's opt-out of replays; quarantines of methods that change answers

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-07 16:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "lossless_checks",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("method", sa.String(length=32), nullable=False),
        sa.Column("k", sa.Integer(), nullable=True),
        sa.Column("drafter", sa.String(length=500), nullable=True),
        sa.Column("backend_name", sa.String(length=200), nullable=False),
        sa.Column("engine_version", sa.String(length=64), nullable=True),
        sa.Column("reference_method", sa.String(length=32), nullable=False),
        sa.Column("reference_backend", sa.String(length=200), nullable=False),
        sa.Column("reference_engine_version", sa.String(length=64), nullable=True),
        sa.Column("unit", sa.String(length=8), nullable=False),
        sa.Column("served_length", sa.Integer(), nullable=False),
        sa.Column("reference_length", sa.Integer(), nullable=False),
        sa.Column("common_prefix", sa.Integer(), nullable=False),
        sa.Column("diverged", sa.Boolean(), nullable=False),
        sa.Column("served_sha256", sa.String(length=64), nullable=False),
        sa.Column("reference_sha256", sa.String(length=64), nullable=False),
        sa.Column("served_request_id", sa.String(length=64), nullable=False),
        sa.Column("replay_request_id", sa.String(length=64), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_lossless_checks")),
    )
    op.create_index(
        op.f("ix_lossless_checks_created_at"), "lossless_checks", ["created_at"], unique=False
    )
    op.create_index("ix_lossless_checks_model_created", "lossless_checks", ["model", "created_at"])
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(
            sa.Column("lossless_opt_out", sa.Boolean(), nullable=False, server_default=sa.false())
        )
    with op.batch_alter_table("models") as batch:
        batch.add_column(
            sa.Column(
                "lossless_quarantine", sa.Boolean(), nullable=False, server_default=sa.false()
            )
        )
    op.create_table(
        "quarantines",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("method", sa.String(length=32), nullable=False),
        sa.Column("since", sa.DateTime(timezone=True), nullable=False),
        sa.Column("evidence", sa.JSON(), nullable=False),
        sa.Column("lifted_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("lifted_by", sa.String(length=64), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_quarantines")),
    )
    op.create_index(op.f("ix_quarantines_model"), "quarantines", ["model"], unique=False)
    op.create_index(
        "uq_quarantines_active",
        "quarantines",
        ["model", "method"],
        unique=True,
        sqlite_where=sa.text("lifted_at IS NULL"),
        postgresql_where=sa.text("lifted_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_index("uq_quarantines_active", table_name="quarantines")
    op.drop_index(op.f("ix_quarantines_model"), table_name="quarantines")
    op.drop_table("quarantines")
    with op.batch_alter_table("models") as batch:
        batch.drop_column("lossless_quarantine")
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_column("lossless_opt_out")
    op.drop_index("ix_lossless_checks_model_created", table_name="lossless_checks")
    op.drop_index(op.f("ix_lossless_checks_created_at"), table_name="lossless_checks")
    op.drop_table("lossless_checks")
