"""Teams and attribution: teams that own keys (a budget, limits and allowed models of their
own), and on every usage record (and in the hourly rollups) its key's team, its end user,
its tags and its endpoint

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-07 20:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0025"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_KEY = (
    "hour", "model", "method", "backend_name", "api_key_id", "request_class", "rule_index",
    "drafter",
)  # fmt: skip
ADDED = ("team_id", "end_user", "tags", "endpoint")
ROW = "uq_usage_hourly_row"


def upgrade() -> None:
    op.create_table(
        "teams",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("budget_usd", sa.Double(), nullable=True),
        sa.Column("budget_period", sa.String(length=16), nullable=False),
        sa.Column("requests_per_minute", sa.Integer(), nullable=True),
        sa.Column("tokens_per_minute", sa.Integer(), nullable=True),
        sa.Column("allowed_models", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_teams")),
        sa.UniqueConstraint("name", name=op.f("uq_teams_name")),
    )
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("team_id", sa.Integer(), nullable=True))
        batch.create_foreign_key(op.f("fk_api_keys_team_id_teams"), "teams", ["team_id"], ["id"])
        batch.create_index(op.f("ix_api_keys_team_id"), ["team_id"], unique=False)
    with op.batch_alter_table("usage_records") as batch:
        batch.add_column(sa.Column("team_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("end_user", sa.String(length=128), nullable=True))
        batch.add_column(sa.Column("tags", sa.String(length=600), nullable=True))
        batch.add_column(sa.Column("endpoint", sa.String(length=64), nullable=True))
    with op.batch_alter_table("usage_hourly") as batch:
        batch.add_column(sa.Column("team_id", sa.Integer(), nullable=False, server_default="0"))
        for name, length in (("end_user", 128), ("tags", 600), ("endpoint", 64)):
            batch.add_column(
                sa.Column(name, sa.String(length=length), nullable=False, server_default="")
            )
        batch.drop_constraint(op.f(ROW), type_="unique")
        batch.create_unique_constraint(op.f(ROW), [*OLD_KEY, *ADDED])


def downgrade() -> None:
    _merge_attributions()
    with op.batch_alter_table("usage_hourly") as batch:
        batch.drop_constraint(op.f(ROW), type_="unique")
        for name in reversed(ADDED):
            batch.drop_column(name)
        batch.create_unique_constraint(op.f(ROW), list(OLD_KEY))
    with op.batch_alter_table("usage_records") as batch:
        for name in reversed(ADDED):
            batch.drop_column(name)
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_index(op.f("ix_api_keys_team_id"))
        batch.drop_constraint(op.f("fk_api_keys_team_id_teams"), type_="foreignkey")
        batch.drop_column("team_id")
    op.drop_table("teams")


def _merge_attributions() -> None:
    """Fold the rows of each old key into its first (by id), so the old unique constraint
    holds again: every summed column added up, nothing lost."""
    bind = op.get_bind()
    table = sa.Table("usage_hourly", sa.MetaData(), autoload_with=bind)
    key = [table.c[name] for name in OLD_KEY]
    summed = [c for c in table.c if c.name not in {"id", *OLD_KEY, *ADDED}]
    query = sa.select(*key, sa.func.min(table.c.id), *(sa.func.sum(c) for c in summed))
    for group in bind.execute(query.group_by(*key).having(sa.func.count() > 1)).all():
        values, first, sums = group[: len(key)], group[len(key)], group[len(key) + 1 :]
        same = sa.and_(*(c == v for c, v in zip(key, values, strict=True)))
        bind.execute(table.delete().where(same, table.c.id != first))
        totals = {c.name: total for c, total in zip(summed, sums, strict=True)}
        bind.execute(table.update().where(table.c.id == first).values(totals))
