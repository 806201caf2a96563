"""What the dashboard reads from the admin API, as typed records (unknown keys ignored)."""

# Over 400 lines: a record per admin API shape the dashboard reads, one contract.

from __future__ import annotations

import datetime as dt
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

PriceKind = Literal["on-demand", "reserved", "spot"]
PRICE_KINDS: tuple[PriceKind, ...] = ("on-demand", "reserved", "spot")


class Record(BaseModel):
    """One admin API object; keys the dashboard does not use are ignored."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class BackendRuntime(Record):
    healthy: bool
    circuit_open: bool
    in_flight: int
    waiting: float
    kv_cache_usage: float
    method_mismatch: str | None = None
    pricing: Literal["curve", "gpu_time", "unpriced"] = "curve"
    acceptance_length: float | None = None  # None: plain, or no data yet
    acceptance_per_position: list[float] | None = None
    acceptance_source: Literal["scrape", "measurement"] | None = None


class Backend(Record):
    name: str
    url: str
    model: str
    method: str
    k: int | None
    drafter: str | None
    gpu_type: str
    gpu_count: int
    enabled: bool
    managed: bool
    speculative_config: dict[str, Any] | None = None
    runtime: BackendRuntime | None = None  # the gateway's view now, for enabled backends
    pool: str | None = None  # the pool whose discovery added it


class PoolDns(Record):
    """Members found at a DNS name's addresses."""

    dns: str
    port: int
    scheme: str


class PoolService(Record):
    """Members found at a Kubernetes Service's ready endpoints (namespace None: the
    gateway's own)."""

    service: str
    namespace: str | None = None
    port: int
    scheme: str


class PoolBackend(Record):
    model: str
    method: str
    k: int | None
    gpu_type: str
    gpu_count: int


class Pool(Record):
    """Backends found by DNS or through the Kubernetes API, one per address: what each is,
    and its members' names."""

    name: str
    discovery: PoolDns | PoolService
    backend: PoolBackend
    members: list[str]
    discovery_error: str | None = None


class DecodingMethod(Record):
    """One method of the gateway's catalog, and what a backend spec for it needs."""

    id: str
    description: str = ""
    speculative: bool  # False only for plain decoding
    k_required: bool
    drafter_required: bool
    drafter_allowed: bool


class MethodRendering(Record):
    """A method spec as vLLM runs it: `vllm serve` and a docker compose file."""

    model: str
    method: str
    k: int | None
    drafter: str | None
    speculative_config: dict[str, Any] | None
    argv: list[str]
    command: str  # argv shell-quoted, to copy and paste
    compose_yaml: str


class Policy(Record):
    mode: Literal["auto", "pinned"] = "auto"
    method: str | None = None
    k: int | None = None
    itl_objective_ms: float | None = None
    explore_fraction: float = 0.0
    rules: list[dict[str, Any]] = []  # kept as they are when the form saves the rest
    classes: dict[str, dict[str, Any]] = {}  # request classes' objectives under auto
    drafter_trial: dict[str, Any] | None = None  # an A/B of two drafters, kept as it is
    lossless_quarantine: bool = False  # auto leaves diverging methods; kept as it is


class Move(Record):
    source: str
    target: str
    started_at: dt.datetime
    step_share: float
    step_s: float
    target_share: float
    ends_at: dt.datetime


class ModelInfo(Record):
    name: str
    policy: Policy
    move: Move | None = None  # a gradual move to the pinned method, while under way


class PolicySaved(ModelInfo):
    warnings: list[str] = []  # what in the policy no enabled backend runs


class Price(Record):
    id: int
    gpu_type: str
    usd_per_gpu_hour: float
    kind: str
    source: str
    date: dt.date


class GpuPrice(Record):
    kind: str
    usd_per_gpu_hour: float
    source: str
    date: dt.date


class Gpu(Record):
    """One GPU type of the planner's catalog, with the prices shipped with it."""

    name: str
    memory_gb: float
    default_prices: list[GpuPrice] = Field(default_factory=list)


class ApiKey(Record):
    id: int
    name: str
    key_prefix: str
    budget_usd: float | None
    budget_period: str
    created_at: dt.datetime
    revoked_at: dt.datetime | None
    team_id: int | None = None


class Team(Record):
    """A group of keys that spends as one (docs/teams.md)."""

    id: int
    name: str
    budget_usd: float | None
    budget_period: str
    weight: float  # its share of a full model's backends beside other teams'
    priority: int  # its requests', lower first
    keys: int  # not revoked


class CreatedKey(ApiKey):
    key: str


class AuditEntry(Record):
    id: int
    at: dt.datetime
    actor: str
    action: str
    resource_type: str
    resource_id: str
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None


class UsageRow(Record):
    """Ledger totals of one group (model, method, key, backend, team or end user) over a
    period."""

    model: str | None = None
    method: str | None = None
    key: int | None = None
    backend: str | None = None
    team: int | None = None
    end_user: str | None = None
    requests: int  # served by a backend
    refused: int = 0  # refused before any backend: no tokens, no cost
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    baseline_cost_usd: float
    savings_usd: float
    cost_usd_95: tuple[float, float] = (0.0, 0.0)
    savings_usd_95: tuple[float, float] = (0.0, 0.0)


class Usage(Record):
    """The totals of GET /savings; the period is the one the dashboard asked for."""

    data: list[UsageRow]


class SpendRow(Record):
    backend: str
    model: str | None
    method: str | None
    gpu_type: str | None
    gpu_count: int
    gpu_hours: float
    usd: float | None
    usd_per_gpu_hour: float | None


class Spend(Record):
    price_kind: str
    data: list[SpendRow]
    gpu_hours: float
    total_usd: float | None  # None: some GPU-hours have no price of that kind
    unpriced_gpu_hours: float


class PlanPrice(Record):
    usd_per_gpu_hour: float
    kind: str
    source: str
    date: str
    origin: str


class PlanChoice(Record):
    """The planner's best method and K at one concurrency."""

    method: str
    k: int
    concurrency: int
    output_tokens_per_s: float
    itl_ms: float
    usd_per_mtok: float
    measured_output_tokens_per_s: float | None
    source: Literal["measured", "estimated"]
    speedup_vs_plain: float


class PlanPoint(Record):
    """One method's best K at one concurrency, as the planner predicts it."""

    method: str
    k: int
    concurrency: int
    output_tokens_per_s: float
    itl_ms: float
    usd_per_mtok: float
    source: Literal["measured", "estimated"]


class Crossover(Record):
    concurrency: int
    from_method: str = Field(alias="from")
    to_method: str = Field(alias="to")


class MethodCapacity(Record):
    method: str
    k: int
    concurrency_per_replica: int
    output_tokens_per_s_per_replica: float
    replicas: int
    gpus: int
    usd_per_month: float
    usd_per_month_95: tuple[float, float] | None = None


class Capacity(Record):
    output_tokens_per_s: float
    itl_objective_ms: float
    methods: list[MethodCapacity]
    savings_usd_per_month: dict[str, dict[str, float]]  # vs_plain, vs_eagle3: by method
    savings_usd_per_month_95: dict[str, dict[str, tuple[float, float] | None]] = {}


class Fit(Record):
    measurements: int
    error_band: float | None
    relative_95: float = 0.0


class Plan(Record):
    model: str
    gpu: str
    gpu_count: int
    workload: str
    engine: str = "vllm"
    itl_objective_ms: float | None
    price: PlanPrice
    choices: list[PlanChoice]
    crossovers: list[Crossover]
    methods: dict[str, list[PlanPoint]] = Field(default_factory=dict)  # each method's curve
    schedules: dict[str, list[list[int]]]
    capacity: Capacity | None
    fit: Fit


class AccuracyPoint(Record):
    model: str
    gpu_type: str
    method: str
    k: int | None
    concurrency: float
    source: str
    measured_output_tokens_per_s: float
    predicted_output_tokens_per_s: float | None
    error: float | None


class Accuracy(Record):
    points: list[AccuracyPoint]
    mean_absolute_error: float | None
    predicted: int


class Measurement(Record):
    """One stored performance point: from the collector, a sweep or an import."""

    id: int
    model: str
    method: str
    k: int
    gpu_type: str
    gpu_count: int
    concurrency: float
    output_tokens_per_s: float
    mean_acceptance_length: float | None
    itl_ms: float | None
    source: str
    backend_name: str | None
    measured_at: dt.datetime


class Benchmark(Record):
    id: int
    status: str
    model: str
    backend_name: str | None
    params: dict[str, Any]
    progress: float
    error: str | None
    result: dict[str, Any] | None


class BenchmarkLevel(Record):
    """One load level of a finished benchmark run."""

    concurrency: float
    completed: int
    output_tokens_per_s: float
    mean_tpot_ms: float | None = None  # per-token latency (absent from older runs)
    mean_itl_ms: float | None = None  # between streamed chunks
    acceptance_length: float | None = None
    acceptance_per_position: list[float] | None = None

    @classmethod
    def of(cls, run: Benchmark) -> list[BenchmarkLevel]:
        """The levels of `run` (none until it has finished)."""
        return [cls.model_validate(level) for level in (run.result or {}).get("levels", [])]


class FleetMethod(Record):
    """A fleet of one method sized hour by hour for the model's traffic."""

    method: str
    k: int
    gpu_type: str
    gpu_count: int
    concurrency_per_replica: float
    output_tokens_per_s_per_replica: float
    itl_ms: float
    meets_objective: bool
    source: Literal["measured", "estimated"]
    relative_95: float
    peak_replicas: int
    gpu_hours: float
    bill_usd: float | None
    bill_usd_95: tuple[float, float] | None


class FleetActual(Record):
    gpu_hours: float
    spend_usd: float | None


class FleetObjective(Record):
    itl_ms: float | None
    sized_for: str
    speculation_pays_below_itl_ms: float | None = None


class FleetLatency(Record):
    method: str
    output_tokens: int
    concurrency_per_backend: float
    itl_ms: float
    plain_itl_ms: float | None
    speedup_vs_plain: float | None


class FleetNow(Record):
    concurrency: float
    output_tokens_per_s: float
    routed_method: str | None
    desired_replicas: dict[str, int]


class Fleet(Record):
    """The bill, right-sized bills per method, achievable savings, over-provisioning."""

    model: str
    price_kind: str
    headroom: float
    idle_pool_replicas: int
    objective: FleetObjective
    actual: FleetActual
    methods: list[FleetMethod]
    best: str | None
    achievable_savings_usd: float | None
    achievable_savings_usd_95: tuple[float, float] | None
    served_bill_usd: float | None
    over_provisioning_usd: float | None
    over_provisioning_usd_95: tuple[float, float] | None
    latency: list[FleetLatency]
    now: FleetNow | None


class CurvePoint(Record):
    """A pooled measured point of a live curve."""

    concurrency: float
    output_tokens_per_s: float  # per GPU
    requests: int
    points: int


class CurveLinePoint(Record):
    """A point of the line that prices requests, with its 95% band."""

    concurrency: float
    output_tokens_per_s: float  # per GPU
    usd_per_mtok: float | None
    relative_95: float
    usd_per_mtok_95: tuple[float, float] | None
    source: Literal["measured", "estimated"]


class Curve(Record):
    """One (model, method, GPU type) curve as the gateway prices requests with it now."""

    model: str
    method: str
    k: int
    gpu_type: str
    usd_per_gpu_hour: float | None
    measured: list[CurvePoint]
    line: list[CurveLinePoint]
    estimated_relative_95: float
    rejected: dict[str, int]


class Curves(Record):
    price_kind: str
    curves: list[Curve]


class FirstDivergence(Record):
    """Where a group's diverged answers first left their replays, in `unit`s."""

    unit: str  # token, char, or mixed (both in one group)
    min: int
    p50: float
    max: int


class LosslessFloor(Record):
    """A model's checks of a method against itself, pooled: nondeterminism alone."""

    samples: int
    divergences: int
    divergence_rate: float | None  # None: no samples
    interval_95: tuple[float, float] | None


class LosslessGroup(Record):
    """One serving configuration's checks against one reference method."""

    method: str
    k: int | None
    drafter: str | None
    backend: str
    engine_version: str | None
    reference_method: str
    is_floor: bool
    samples: int
    divergences: int
    by_tokens: int  # of the samples, those compared by token ids (the rest as text)
    divergence_rate: float
    interval_95: tuple[float, float]
    first_divergence: FirstDivergence | None
    last_seen: dt.datetime


class LosslessReplays(Record):
    """The watchdog's replays in the ledger and their capacity cost."""

    requests: int
    unpriced: int
    cost_usd: float


class LosslessModel(Record):
    model: str
    floor: LosslessFloor
    replays: LosslessReplays
    groups: list[LosslessGroup]


class LosslessReport(Record):
    """GET /lossless: served answers against their replays on the reference method."""

    models: list[LosslessModel]
