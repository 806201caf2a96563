"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-29 10:03:51.418648
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:

    op.create_table(
        "api_keys",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("key_prefix", sa.String(length=16), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("requests_per_minute", sa.Integer(), nullable=True),
        sa.Column("tokens_per_minute", sa.Integer(), nullable=True),
        sa.Column("budget_usd", sa.Double(), nullable=True),
        sa.Column("budget_period", sa.String(length=16), nullable=False),
        sa.Column("allowed_models", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("key_hash", name=op.f("uq_api_keys_key_hash")),
    )
    op.create_table(
        "audit_log",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(length=64), nullable=False),
        sa.Column("action", sa.String(length=16), nullable=False),
        sa.Column("resource_type", sa.String(length=32), nullable=False),
        sa.Column("resource_id", sa.String(length=500), nullable=False),
        sa.Column("before", sa.JSON(), nullable=True),
        sa.Column("after", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_log")),
    )
    op.create_index(op.f("ix_audit_log_at"), "audit_log", ["at"], unique=False)

    op.create_table(
        "backends",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("url", sa.String(length=500), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("method", sa.String(length=32), nullable=False),
        sa.Column("k", sa.Integer(), nullable=True),
        sa.Column("drafter", sa.String(length=500), nullable=True),
        sa.Column("speculative_options", sa.JSON(), nullable=False),
        sa.Column("gpu_type", sa.String(length=32), nullable=False),
        sa.Column("gpu_count", sa.Integer(), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False),
        sa.Column("managed", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("gpu_count >= 1", name=op.f("ck_backends_gpu_count_positive")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_backends")),
        sa.UniqueConstraint("name", name=op.f("uq_backends_name")),
    )
    op.create_index(op.f("ix_backends_model"), "backends", ["model"], unique=False)

    op.create_table(
        "benchmark_runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("url", sa.String(length=500), nullable=False),
        sa.Column("backend_name", sa.String(length=200), nullable=True),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("progress", sa.Double(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')",
            name=op.f("ck_benchmark_runs_status_known"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_benchmark_runs")),
    )
    op.create_table(
        "gpu_prices",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("gpu_type", sa.String(length=32), nullable=False),
        sa.Column("usd_per_gpu_hour", sa.Double(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("source", sa.String(length=500), nullable=False),
        sa.Column("date", sa.Date(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "kind IN ('on-demand', 'reserved', 'spot')", name=op.f("ck_gpu_prices_kind_known")
        ),
        sa.CheckConstraint("usd_per_gpu_hour >= 0", name=op.f("ck_gpu_prices_price_not_negative")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_gpu_prices")),
        sa.UniqueConstraint("gpu_type", "kind", name=op.f("uq_gpu_prices_gpu_type_kind")),
    )
    op.create_table(
        "measurements",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("method", sa.String(length=32), nullable=False),
        sa.Column("k", sa.Integer(), nullable=False),
        sa.Column("gpu_type", sa.String(length=32), nullable=False),
        sa.Column("gpu_count", sa.Integer(), nullable=False),
        sa.Column("concurrency", sa.Double(), nullable=False),
        sa.Column("output_tokens_per_s", sa.Double(), nullable=False),
        sa.Column("mean_acceptance_length", sa.Double(), nullable=True),
        sa.Column("acceptance_per_position", sa.JSON(), nullable=True),
        sa.Column("ttft_ms", sa.Double(), nullable=True),
        sa.Column("itl_ms", sa.Double(), nullable=True),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("backend_name", sa.String(length=200), nullable=True),
        sa.Column("measured_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "source IN ('scrape', 'bench', 'import')", name=op.f("ck_measurements_source_known")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_measurements")),
    )
    op.create_index(
        op.f("ix_measurements_model_method_gpu_type"),
        "measurements",
        ["model", "method", "gpu_type"],
        unique=False,
    )

    op.create_table(
        "models",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("mode", sa.String(length=16), nullable=False),
        sa.Column("method", sa.String(length=32), nullable=True),
        sa.Column("k", sa.Integer(), nullable=True),
        sa.Column("itl_objective_ms", sa.Double(), nullable=True),
        sa.Column("explore_fraction", sa.Double(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("mode IN ('auto', 'pinned')", name=op.f("ck_models_mode_known")),
        sa.CheckConstraint(
            "explore_fraction >= 0 AND explore_fraction <= 1", name=op.f("ck_models_explore_range")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_models")),
        sa.UniqueConstraint("name", name=op.f("uq_models_name")),
    )
    op.create_table(
        "usage_hourly",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("method", sa.String(length=32), nullable=False),
        sa.Column("backend_name", sa.String(length=200), nullable=False),
        sa.Column("api_key_id", sa.Integer(), nullable=False),
        sa.Column("requests", sa.Integer(), nullable=False),
        sa.Column("errors", sa.Integer(), nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
        sa.Column("completion_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cost_usd", sa.Double(), nullable=False),
        sa.Column("baseline_cost_usd", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_usage_hourly")),
        sa.UniqueConstraint(
            "hour",
            "model",
            "method",
            "backend_name",
            "api_key_id",
            name=op.f("uq_usage_hourly_hour_model_method_backend_name_api_key_id"),
        ),
    )
    op.create_table(
        "usage_records",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("request_id", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("api_key_id", sa.Integer(), nullable=True),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("method", sa.String(length=32), nullable=True),
        sa.Column("backend_name", sa.String(length=200), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=False),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("latency_ms", sa.Double(), nullable=False),
        sa.Column("ttft_ms", sa.Double(), nullable=True),
        sa.Column("concurrency", sa.Double(), nullable=True),
        sa.Column("cost_usd", sa.Double(), nullable=True),
        sa.Column("baseline_cost_usd", sa.Double(), nullable=True),
        sa.ForeignKeyConstraint(
            ["api_key_id"], ["api_keys.id"], name=op.f("fk_usage_records_api_key_id_api_keys")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_usage_records")),
        sa.UniqueConstraint("request_id", name=op.f("uq_usage_records_request_id")),
    )
    op.create_index(
        op.f("ix_usage_records_created_at"), "usage_records", ["created_at"], unique=False
    )


def downgrade() -> None:

    op.drop_index(op.f("ix_usage_records_created_at"), table_name="usage_records")

    op.drop_table("usage_records")
    op.drop_table("usage_hourly")
    op.drop_table("models")
    op.drop_index(op.f("ix_measurements_model_method_gpu_type"), table_name="measurements")

    op.drop_table("measurements")
    op.drop_table("gpu_prices")
    op.drop_table("benchmark_runs")
    op.drop_index(op.f("ix_backends_model"), table_name="backends")

    op.drop_table("backends")
    op.drop_index(op.f("ix_audit_log_at"), table_name="audit_log")

    op.drop_table("audit_log")
    op.drop_table("api_keys")
