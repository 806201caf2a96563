"""Usage records carry their request class and the rule that routed them; the hourly
rollups are kept per class and rule too, with the sums a class's acceptance interval needs

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-06 20:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_KEY = ("hour", "model", "method", "backend_name", "api_key_id")
OLD_NAME = "uq_usage_hourly_hour_model_method_backend_name_api_key_id"
NEW_NAME = "uq_usage_hourly_row"
SQUARES = ("accepted_sq", "accepted_steps", "steps_sq")


def upgrade() -> None:
    with op.batch_alter_table("usage_records") as batch:
        batch.add_column(sa.Column("request_class", sa.String(length=32), nullable=True))
        batch.add_column(sa.Column("rule_index", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("acceptance_factor", sa.Double(), nullable=True))
    with op.batch_alter_table("usage_hourly") as batch:
        batch.add_column(
            sa.Column("request_class", sa.String(length=32), nullable=False, server_default="")
        )
        batch.add_column(sa.Column("rule_index", sa.Integer(), nullable=False, server_default="-1"))
        batch.add_column(
            sa.Column("spec_requests", sa.Integer(), nullable=False, server_default="0")
        )
        for name in SQUARES:
            batch.add_column(sa.Column(name, sa.Double(), nullable=False, server_default="0"))
        batch.drop_constraint(op.f(OLD_NAME), type_="unique")
        batch.create_unique_constraint(op.f(NEW_NAME), [*OLD_KEY, "request_class", "rule_index"])


def downgrade() -> None:
    _merge_classes_and_rules()
    with op.batch_alter_table("usage_hourly") as batch:
        batch.drop_constraint(op.f(NEW_NAME), type_="unique")
        for name in ("request_class", "rule_index", "spec_requests", *SQUARES):
            batch.drop_column(name)
        batch.create_unique_constraint(op.f(OLD_NAME), list(OLD_KEY))
    with op.batch_alter_table("usage_records") as batch:
        batch.drop_column("acceptance_factor")
        batch.drop_column("rule_index")
        batch.drop_column("request_class")


def _merge_classes_and_rules() -> None:
    """Fold the rows of each old key into its first (by id), so the old unique constraint
    holds again: every summed column added up, nothing lost."""
    bind = op.get_bind()
    table = sa.Table("usage_hourly", sa.MetaData(), autoload_with=bind)
    key = [table.c[name] for name in OLD_KEY]
    dropped = {"id", *OLD_KEY, "request_class", "rule_index"}
    summed = [c for c in table.c if c.name not in dropped]
    query = sa.select(*key, sa.func.min(table.c.id), *(sa.func.sum(c) for c in summed))
    for group in bind.execute(query.group_by(*key).having(sa.func.count() > 1)).all():
        values, first, sums = group[: len(key)], group[len(key)], group[len(key) + 1 :]
        same = sa.and_(*(c == v for c, v in zip(key, values, strict=True)))
        bind.execute(table.delete().where(same, table.c.id != first))
        totals = {c.name: total for c, total in zip(summed, sums, strict=True)}
        bind.execute(table.update().where(table.c.id == first).values(totals))
