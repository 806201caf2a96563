"""The database tables, as SQLAlchemy 2 typed models."""

# Over 400 lines: every table in one place, as the migrations see them.

from __future__ import annotations

from datetime import date, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    Date,
    Double,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from gateway.db.base import Base, UtcDateTime, utcnow
from gateway.db.sealed import Sealed

# SQLite only auto-increments a column declared exactly INTEGER PRIMARY KEY.
BigId = BigInteger().with_variant(Integer(), "sqlite")

NAME = 200
URL = 500
VERSION = 64
RESPONSE_ID = 128  # a vLLM response id is `resp_` and 32 hex digits
CLASS_NAME = 32  # a request class, as DRAFTGATE_REQUEST_CLASSES names it
END_USER = 128  # the end user a request names (OpenAI's `user`), at most
TAGS = 600  # a request's tags as stored: ",a,b,", at most 8 of 64 characters
ENDPOINT = 64  # a relayed path


class Timestamps:
    """Creation and last-update times."""

    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow, onupdate=utcnow)


class Backend(Timestamps, Base):
    """One vLLM server serving one model with one decoding method."""

    __tablename__ = "backends"
    __table_args__ = (CheckConstraint("gpu_count >= 1", name="gpu_count_positive"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME), unique=True)
    url: Mapped[str] = mapped_column(String(URL))
    model: Mapped[str] = mapped_column(String(NAME), index=True)
    method: Mapped[str] = mapped_column(String(32))
    k: Mapped[int | None]
    drafter: Mapped[str | None] = mapped_column(String(URL))
    # The vLLM version its `/version` reports (None before it was read, or where it serves none).
    engine_version: Mapped[str | None] = mapped_column(String(VERSION))
    # vLLM speculative-config keys beyond method, model and K (schedule, adaptive verification…).
    speculative_options: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    gpu_type: Mapped[str] = mapped_column(String(32))
    gpu_count: Mapped[int] = mapped_column(default=1)
    enabled: Mapped[bool] = mapped_column(default=True)
    # Managed backends are started and stopped by draftgate; external ones only routed to.
    managed: Mapped[bool] = mapped_column(default=False)
    # The key the backend's vLLM was started with (`--api-key`): sent upstream, never shown.
    api_key: Mapped[str | None] = mapped_column(Sealed())  # sealed when keys are set
    # The pool whose discovery added it (one member per address), or None: a pool of one.
    pool: Mapped[str | None] = mapped_column(String(NAME), index=True)
    # Its server's --scheduling-policy: "priority" servers are sent each request's priority
    scheduling: Mapped[str] = mapped_column(String(16), default="fcfs", server_default="fcfs")


class Pool(Timestamps, Base):
    """Backends alike but for their address: a template, and where its members are found
    (a DNS name's addresses, or a Kubernetes Service's ready endpoints), each made a backend
    by discovery."""

    __tablename__ = "pools"
    __table_args__ = (
        CheckConstraint("port >= 1 AND port <= 65535", name="port_range"),
        CheckConstraint("(dns_name IS NULL) <> (service IS NULL)", name="one_source"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME), unique=True)
    dns_name: Mapped[str | None] = mapped_column(String(255))
    # A Kubernetes Service and its namespace (None: the gateway's own), in place of dns_name.
    service: Mapped[str | None] = mapped_column(String(63))
    namespace: Mapped[str | None] = mapped_column(String(63))
    port: Mapped[int] = mapped_column(default=8000)
    scheme: Mapped[str] = mapped_column(String(8), default="http")
    # A member's fields but its name and URL (model, method, K, drafter, GPUs, key...).
    template: Mapped[dict[str, Any]] = mapped_column(JSON)
    # Why its last resolution failed (its members last seen are kept), or None.
    discovery_error: Mapped[str | None] = mapped_column(String(URL))


class ModelPolicy(Timestamps, Base):
    """A served model name and the policy choosing which method serves it."""

    __tablename__ = "models"
    __table_args__ = (
        CheckConstraint("mode IN ('auto', 'pinned')", name="mode_known"),
        CheckConstraint("explore_fraction >= 0 AND explore_fraction <= 1", name="explore_range"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME), unique=True)
    mode: Mapped[str] = mapped_column(String(16), default="auto")
    method: Mapped[str | None] = mapped_column(String(32))
    k: Mapped[int | None]
    itl_objective_ms: Mapped[float | None]
    explore_fraction: Mapped[float] = mapped_column(default=0.0)
    # [{"when": [feature, ...], "method": m, "k": k}, ...], the first match picks the method
    rules: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    # A gradual move to `method` under way: {"from", "started_at" (epoch s), "step_share",
    # "step_s"}; None when the pinned method takes all the traffic.
    move: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # {class name: {"objective", "itl_objective_ms", "max_usd_per_mtok"}} for `auto`
    classes: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # An A/B of two drafters of one method: {"drafter", "share"} (None: no trial)
    drafter_trial: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # The lossless watchdog quarantines a method whose answers diverge (docs/lossless.md)
    lossless_quarantine: Mapped[bool] = mapped_column(default=False, server_default=false())


class Team(Base):
    """A group of keys that spends as one: usage is attributed to it (docs/teams.md)."""

    __tablename__ = "teams"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME), unique=True)
    budget_usd: Mapped[float | None]
    budget_period: Mapped[str] = mapped_column(String(16), default="monthly")
    requests_per_minute: Mapped[int | None]
    tokens_per_minute: Mapped[int | None]
    allowed_models: Mapped[list[str] | None] = mapped_column(JSON)
    # Its share of a full model's backends beside other teams', and its requests' priority
    # (lower first, as vLLM orders them): gateway/relay/fairshare.py
    weight: Mapped[float] = mapped_column(default=1.0, server_default="1")
    priority: Mapped[int] = mapped_column(default=0, server_default="0")
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)


class ApiKey(Base):
    """A client API key; only its SHA-256 hash and a display prefix are stored."""

    __tablename__ = "api_keys"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME))
    key_prefix: Mapped[str] = mapped_column(String(16))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    requests_per_minute: Mapped[int | None]
    tokens_per_minute: Mapped[int | None]
    max_concurrent_requests: Mapped[int | None]
    max_body_bytes: Mapped[int | None]
    # Its requests are never replayed by the lossless watchdog (gateway/lossless.py)
    lossless_opt_out: Mapped[bool] = mapped_column(default=False, server_default=false())
    budget_usd: Mapped[float | None]
    budget_period: Mapped[str] = mapped_column(String(16), default="monthly")
    request_class: Mapped[str | None] = mapped_column(String(CLASS_NAME))
    allowed_models: Mapped[list[str] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    team_id: Mapped[int | None] = mapped_column(ForeignKey("teams.id"), index=True)


class GpuPrice(Timestamps, Base):
    """What one GPU-hour of a type costs, with where the figure came from."""

    __tablename__ = "gpu_prices"
    __table_args__ = (
        UniqueConstraint("gpu_type", "kind"),
        CheckConstraint("kind IN ('on-demand', 'reserved', 'spot')", name="kind_known"),
        CheckConstraint("usd_per_gpu_hour >= 0", name="price_not_negative"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    gpu_type: Mapped[str] = mapped_column(String(32))
    usd_per_gpu_hour: Mapped[float]
    kind: Mapped[str] = mapped_column(String(16), default="on-demand")
    source: Mapped[str] = mapped_column(String(URL))
    date: Mapped[date] = mapped_column(Date)


class UsageRecord(Base):
    """One client request as the ledger saw it."""

    __tablename__ = "usage_records"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    request_id: Mapped[str] = mapped_column(String(64), unique=True)  # made by the gateway
    client_request_id: Mapped[str | None] = mapped_column(String(64), index=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow, index=True)
    api_key_id: Mapped[int | None] = mapped_column(ForeignKey("api_keys.id"))
    model: Mapped[str] = mapped_column(String(NAME))
    method: Mapped[str | None] = mapped_column(String(32))
    backend_name: Mapped[str | None] = mapped_column(String(NAME))
    prompt_tokens: Mapped[int] = mapped_column(default=0)
    completion_tokens: Mapped[int] = mapped_column(default=0)
    status_code: Mapped[int]
    outcome: Mapped[str] = mapped_column(String(32))
    latency_ms: Mapped[float]
    ttft_ms: Mapped[float | None]
    concurrency: Mapped[float | None]
    cost_usd: Mapped[float | None]
    baseline_cost_usd: Mapped[float | None]
    # Where the $/1M that priced it came from: "measured" when its concurrency lies within
    # the measured points of its curve, else "estimated"; "gpu_time" when no curve priced
    # it (its share of the backend's GPU time); NULL when it was not priced.
    curve_source: Mapped[str | None] = mapped_column(String(16))
    # 95% half-widths of the two costs, from the bands of the curves that priced them.
    cost_error_usd: Mapped[float | None]
    baseline_error_usd: Mapped[float | None]
    # The prefill price both costs include for the prompt (NULL: prompts unpriced).
    prompt_usd_per_mtok: Mapped[float | None]
    # The token counts are the gateway's estimate (a non-streamed request abandoned by its
    # client: the backend never said what it generated), not the backend's report.
    tokens_estimated: Mapped[bool] = mapped_column(default=False, server_default=false())
    # Of the prompt tokens, those the backend read from its prefix cache, so not priced
    # (vLLM's `prompt_tokens_details.cached_tokens`); NULL when the backend did not say.
    cached_prompt_tokens: Mapped[int | None]
    # The Responses API's id for what the backend stored (a later turn's
    # `previous_response_id` goes to the same backend); NULL for every other request.
    response_id: Mapped[str | None] = mapped_column(String(RESPONSE_ID), index=True)
    # Its own speculative decoding where the engine reported it (vLLM's per-request spec
    # decode metrics): verify steps, draft tokens proposed, accepted; NULL: not reported.
    spec_steps: Mapped[int | None]
    draft_tokens: Mapped[int | None]
    accepted_tokens: Mapped[int | None]
    # Its request class, and the position of the policy rule that routed it (NULL: none;
    # the policy's own choice served it, or it was refused before routing).
    request_class: Mapped[str | None] = mapped_column(String(CLASS_NAME))
    rule_index: Mapped[int | None]
    # Its output tokens were priced from its class's own acceptance: the curve's $/1M output
    # times this, the method's mean acceptance length over the class's (NULL: the average).
    acceptance_factor: Mapped[float | None]
    drafter: Mapped[str | None] = mapped_column(String(URL))  # its backend's, when served
    drafter_factor: Mapped[float | None]  # its drafter's price over the curve's (None: none)
    # Its context's correction, in cost_usd and baseline_cost_usd (None: none applied)
    context_usd: Mapped[float | None]
    baseline_context_usd: Mapped[float | None]
    # Who it is attributed to (docs/teams.md): its key's team then, the end user (the
    # `user` field or the configured header), the tags header's tags (",a,b,": each found
    # with LIKE '%,a,%'), and the endpoint (its path)
    team_id: Mapped[int | None]
    end_user: Mapped[str | None] = mapped_column(String(END_USER))
    tags: Mapped[str | None] = mapped_column(String(TAGS))
    endpoint: Mapped[str | None] = mapped_column(String(ENDPOINT))


class UsageHourly(Base):
    """Usage rolled up per hour, model, method, backend, key (0 = no key), request class
    ('' = none), rule (-1 = none), drafter ('' = none), team (0 = none), end user, tags and
    endpoint ('' = none)."""

    __tablename__ = "usage_hourly"
    __table_args__ = (
        UniqueConstraint(
            "hour", "model", "method", "backend_name", "api_key_id", "request_class",
            "rule_index", "drafter", "team_id", "end_user", "tags", "endpoint",
            name="uq_usage_hourly_row",
        ),
    )  # fmt: skip

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    hour: Mapped[datetime] = mapped_column(UtcDateTime)
    model: Mapped[str] = mapped_column(String(NAME))
    method: Mapped[str] = mapped_column(String(32))
    backend_name: Mapped[str] = mapped_column(String(NAME))
    api_key_id: Mapped[int] = mapped_column(default=0)
    requests: Mapped[int] = mapped_column(default=0)
    errors: Mapped[int] = mapped_column(default=0)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    completion_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cost_usd: Mapped[float] = mapped_column(default=0.0)
    baseline_cost_usd: Mapped[float] = mapped_column(default=0.0)
    # Request-seconds in flight (the sum of latencies): over 3600 s, the hour's mean
    # concurrency by Little's law.
    busy_s: Mapped[float] = mapped_column(default=0.0, server_default="0")
    # Sums of the records' cost half-widths: errors of one curve move together, so the
    # interval of a sum is the sum of the half-widths.
    cost_error_usd: Mapped[float] = mapped_column(default=0.0, server_default="0")
    baseline_error_usd: Mapped[float] = mapped_column(default=0.0, server_default="0")
    # Prompt tokens read from the prefix cache, and the prefill they skipped at the prompt
    # price each record was given: a capacity cost the cache avoided, not money released.
    cached_prompt_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    prefill_saved_by_cache_usd: Mapped[float] = mapped_column(default=0.0, server_default="0")
    # Sums of the records' own speculative decoding, where reported: acceptance length is
    # 1 + accepted_tokens / spec_steps over the requests that said.
    spec_steps: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    draft_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    accepted_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    request_class: Mapped[str] = mapped_column(String(CLASS_NAME), default="", server_default="")
    rule_index: Mapped[int] = mapped_column(default=-1, server_default="-1")
    drafter: Mapped[str] = mapped_column(String(URL), default="", server_default="")
    team_id: Mapped[int] = mapped_column(default=0, server_default="0")
    end_user: Mapped[str] = mapped_column(String(END_USER), default="", server_default="")
    tags: Mapped[str] = mapped_column(String(TAGS), default="", server_default="")
    endpoint: Mapped[str] = mapped_column(String(ENDPOINT), default="", server_default="")
    # For the interval of a class's acceptance (a ratio estimator): the requests that
    # reported a verify step or more (a one-token answer has none: no sample, so a stream of
    # them cannot bring a class to its minimum), and the sums of accepted², accepted·steps
    # and steps².
    spec_requests: Mapped[int] = mapped_column(default=0, server_default="0")
    accepted_sq: Mapped[float] = mapped_column(default=0.0, server_default="0")
    accepted_steps: Mapped[float] = mapped_column(default=0.0, server_default="0")
    steps_sq: Mapped[float] = mapped_column(default=0.0, server_default="0")


class Measurement(Base):
    """One observed performance point of a method at a concurrency."""

    __tablename__ = "measurements"
    __table_args__ = (
        Index("ix_measurements_model_method_gpu_type", "model", "method", "gpu_type"),
        CheckConstraint("source IN ('scrape', 'bench', 'import')", name="source_known"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    model: Mapped[str] = mapped_column(String(NAME))
    method: Mapped[str] = mapped_column(String(32))
    k: Mapped[int] = mapped_column(default=0)
    gpu_type: Mapped[str] = mapped_column(String(32))
    gpu_count: Mapped[int] = mapped_column(default=1)
    concurrency: Mapped[float]
    output_tokens_per_s: Mapped[float]
    mean_acceptance_length: Mapped[float | None]
    acceptance_per_position: Mapped[list[float] | None] = mapped_column(JSON)
    ttft_ms: Mapped[float | None]
    itl_ms: Mapped[float | None]
    source: Mapped[str] = mapped_column(String(16))
    backend_name: Mapped[str | None] = mapped_column(String(NAME))
    # What served it: the drafter and the engine's version (None: not known).
    drafter: Mapped[str | None] = mapped_column(String(URL))
    engine_version: Mapped[str | None] = mapped_column(String(VERSION))
    measured_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    # The sample: requests finished in it, and their mean prompt and answer lengths (NULL
    # where the source does not say: weighted as one request, shape unknown).
    requests: Mapped[int | None]
    mean_prompt_tokens: Mapped[float | None]
    mean_output_tokens: Mapped[float | None]


class BenchmarkRun(Base):
    """A load sweep against one backend: its parameters, progress and results."""

    __tablename__ = "benchmark_runs"
    __table_args__ = (
        CheckConstraint(
            "status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')",
            name="status_known",
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    status: Mapped[str] = mapped_column(String(16), default="queued")
    model: Mapped[str] = mapped_column(String(NAME))
    url: Mapped[str] = mapped_column(String(URL))
    backend_name: Mapped[str | None] = mapped_column(String(NAME))
    params: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    progress: Mapped[float] = mapped_column(default=0.0)
    error: Mapped[str | None] = mapped_column(Text)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    # While running: when the leader running it last said so (a stale one has died).
    heartbeat_at: Mapped[datetime | None] = mapped_column(UtcDateTime)


class AuditEntry(Base):
    """One change made through the admin API, the CLI or fleet.yaml."""

    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow, index=True)
    actor: Mapped[str] = mapped_column(String(64))
    action: Mapped[str] = mapped_column(String(16))
    resource_type: Mapped[str] = mapped_column(String(32))
    resource_id: Mapped[str] = mapped_column(String(URL))
    before: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    after: Mapped[dict[str, Any] | None] = mapped_column(JSON)


class RateWindow(Base):
    """Requests and tokens of one API key in one minute, summed over gateway replicas."""

    __tablename__ = "rate_windows"

    api_key_id: Mapped[int] = mapped_column(primary_key=True)
    window_start: Mapped[int] = mapped_column(BigInteger, primary_key=True)  # unix minute
    requests: Mapped[int] = mapped_column(default=0)
    tokens: Mapped[int] = mapped_column(BigInteger, default=0)


class Lease(Base):
    """A job that one gateway replica does for all (pool discovery): who holds it and until
    when, in seconds since the epoch by the database's clock (gateway/services/leases.py)."""

    __tablename__ = "leases"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str] = mapped_column(String(NAME))
    expires_at: Mapped[float] = mapped_column(Double)


class LosslessCheck(Base):
    """One served answer compared with its replay on the model's reference method by the
    lossless watchdog: where the two first differ, never what they say (hashes only)."""

    __tablename__ = "lossless_checks"
    __table_args__ = (Index("ix_lossless_checks_model_created", "model", "created_at"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow, index=True)
    model: Mapped[str] = mapped_column(String(NAME))
    # The served answer's method, K, drafter, backend and its engine version (`/version`)
    method: Mapped[str] = mapped_column(String(32))
    k: Mapped[int | None]
    drafter: Mapped[str | None] = mapped_column(String(URL))
    backend_name: Mapped[str] = mapped_column(String(NAME))
    engine_version: Mapped[str | None] = mapped_column(String(VERSION))
    # The replay's: the model's reference method (plain unless configured)
    reference_method: Mapped[str] = mapped_column(String(32))
    reference_backend: Mapped[str] = mapped_column(String(NAME))
    reference_engine_version: Mapped[str | None] = mapped_column(String(VERSION))
    unit: Mapped[str] = mapped_column(String(8))  # "token" (ids compared) or "char" (text)
    served_length: Mapped[int]
    reference_length: Mapped[int]
    common_prefix: Mapped[int]  # in `unit`s; where they first differ when they do
    diverged: Mapped[bool]
    served_sha256: Mapped[str] = mapped_column(String(64))
    reference_sha256: Mapped[str] = mapped_column(String(64))
    served_request_id: Mapped[str] = mapped_column(String(64))  # the usage records' ids
    replay_request_id: Mapped[str] = mapped_column(String(64))


class Quarantine(Base):
    """A method the lossless watchdog took out of a model's `auto` choices for changing its
    answers, with the evidence; active until an admin lifts it."""

    __tablename__ = "quarantines"
    # One active quarantine per method: two replicas' leaders judging at once cannot both hold
    __table_args__ = (
        Index(
            "uq_quarantines_active",
            "model",
            "method",
            unique=True,
            sqlite_where=text("lifted_at IS NULL"),
            postgresql_where=text("lifted_at IS NULL"),
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    model: Mapped[str] = mapped_column(String(NAME), index=True)
    method: Mapped[str] = mapped_column(String(32))
    since: Mapped[datetime] = mapped_column(UtcDateTime, default=utcnow)
    # {"samples", "divergences", "divergence_rate", "interval_95", "reference_method",
    #  "threshold", "floor": {...}, "checks_since"}: what the watchdog saw
    evidence: Mapped[dict[str, Any]] = mapped_column(JSON)
    lifted_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    lifted_by: Mapped[str | None] = mapped_column(String(64))
