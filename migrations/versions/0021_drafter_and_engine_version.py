"""Drafters and engine versions are dimensions: each backend's vLLM version (read from its
`/version`), the drafter and engine version each measurement was taken with (so an upgrade
does not mix old and new prices in one curve), the drafter each request was served by (on
usage records and in the hourly rollups), a model's drafter trial (an A/B of two drafters
of one method), and each record's context correction

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-07 00:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_KEY = (
    "hour", "model", "method", "backend_name", "api_key_id", "request_class", "rule_index"
)  # fmt: skip
ROW = "uq_usage_hourly_row"


def upgrade() -> None:
    with op.batch_alter_table("backends") as batch:
        batch.add_column(sa.Column("engine_version", sa.String(64), nullable=True))
    with op.batch_alter_table("measurements") as batch:
        batch.add_column(sa.Column("drafter", sa.String(500), nullable=True))
        batch.add_column(sa.Column("engine_version", sa.String(64), nullable=True))
    with op.batch_alter_table("models") as batch:
        batch.add_column(sa.Column("drafter_trial", sa.JSON(), nullable=True))
    with op.batch_alter_table("usage_records") as batch:
        batch.add_column(sa.Column("drafter", sa.String(500), nullable=True))
        batch.add_column(sa.Column("drafter_factor", sa.Double(), nullable=True))
        batch.add_column(sa.Column("context_usd", sa.Double(), nullable=True))
        batch.add_column(sa.Column("baseline_context_usd", sa.Double(), nullable=True))
    with op.batch_alter_table("usage_hourly") as batch:
        batch.add_column(sa.Column("drafter", sa.String(500), nullable=False, server_default=""))
        batch.drop_constraint(op.f(ROW), type_="unique")
        batch.create_unique_constraint(op.f(ROW), [*OLD_KEY, "drafter"])


def downgrade() -> None:
    _merge_drafters()
    with op.batch_alter_table("usage_hourly") as batch:
        batch.drop_constraint(op.f(ROW), type_="unique")
        batch.drop_column("drafter")
        batch.create_unique_constraint(op.f(ROW), list(OLD_KEY))
    with op.batch_alter_table("usage_records") as batch:
        batch.drop_column("baseline_context_usd")
        batch.drop_column("context_usd")
        batch.drop_column("drafter_factor")
        batch.drop_column("drafter")
    with op.batch_alter_table("models") as batch:
        batch.drop_column("drafter_trial")
    with op.batch_alter_table("measurements") as batch:
        batch.drop_column("engine_version")
        batch.drop_column("drafter")
    with op.batch_alter_table("backends") as batch:
        batch.drop_column("engine_version")


def _merge_drafters() -> None:
    """Fold the rows of each old key into its first (by id), so the old unique constraint
    holds again: every summed column added up, nothing lost."""
    bind = op.get_bind()
    table = sa.Table("usage_hourly", sa.MetaData(), autoload_with=bind)
    key = [table.c[name] for name in OLD_KEY]
    summed = [c for c in table.c if c.name not in {"id", *OLD_KEY, "drafter"}]
    query = sa.select(*key, sa.func.min(table.c.id), *(sa.func.sum(c) for c in summed))
    for group in bind.execute(query.group_by(*key).having(sa.func.count() > 1)).all():
        values, first, sums = group[: len(key)], group[len(key)], group[len(key) + 1 :]
        same = sa.and_(*(c == v for c, v in zip(key, values, strict=True)))
        bind.execute(table.delete().where(same, table.c.id != first))
        totals = {c.name: total for c, total in zip(summed, sums, strict=True)}
        bind.execute(table.update().where(table.c.id == first).values(totals))
