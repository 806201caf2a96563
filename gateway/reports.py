"""The shapes of the admin API's reports: plan, accuracy, spend and savings (read-only)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class Report(BaseModel):
    """A report field by field; `from`/`to` are serialised under those names."""

    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)


class PlanPrice(Report):
    """The price a plan assumes, and where it came from."""

    usd_per_gpu_hour: float
    kind: str
    source: str
    date: str
    origin: Literal["database", "default"]


class PlanPoint(Report):
    """One method and K at one concurrency, as the planner predicts it (and measured, if so)."""

    method: str
    k: int
    concurrency: int
    output_tokens_per_s: float
    itl_ms: float
    usd_per_mtok: float
    measured_output_tokens_per_s: float | None  # all GPUs of the plan, when measured
    source: Literal["measured", "estimated"]


class PlanChoice(PlanPoint):
    """The best method and K at one concurrency."""

    speedup_vs_plain: float


class Crossover(Report):
    """A concurrency where the best method changes."""

    concurrency: int
    from_method: str = Field(alias="from")
    to_method: str = Field(alias="to")


class MethodCapacity(Report):
    """What serving a traffic with one method takes."""

    method: str
    k: int
    concurrency_per_replica: int
    output_tokens_per_s_per_replica: float
    replicas: int
    gpus: int
    usd_per_month: float


class CapacityPlan(Report):
    """GPUs and $/month per method for a traffic, with savings against plain and EAGLE-3."""

    output_tokens_per_s: float
    itl_objective_ms: float
    methods: list[MethodCapacity]
    savings_usd_per_month: dict[str, dict[str, float]]  # vs_plain, vs_eagle3: by method


class PlanFit(Report):
    """How many measurements the plan was fitted to, and its held-out error."""

    measurements: int
    error_band: float | None  # mean |prediction / measurement - 1| on held-out points


class PlanReport(Report):
    """Per concurrency, the best method and K within the ITL objective, and its cost."""

    fit: PlanFit
    capacity: CapacityPlan | None
    model: str
    gpu: str
    gpu_count: int
    workload: str
    itl_objective_ms: float | None
    price: PlanPrice
    choices: list[PlanChoice]
    crossovers: list[Crossover]
    methods: dict[str, list[PlanPoint]]  # each method's curve at its best K
    schedules: dict[str, list[list[int]]]  # vLLM's K schedule: [batch_lo, batch_hi, K]


class AccuracyPoint(Report):
    """A measured point beside the prediction of a fit that did not see it."""

    model: str
    gpu_type: str
    method: str
    k: int
    concurrency: float
    source: str
    measured_output_tokens_per_s: float  # per GPU
    predicted_output_tokens_per_s: float | None
    error: float | None  # predicted / measured - 1


class AccuracyReport(Report):
    """Every measured point against the planner's held-out prediction."""

    points: list[AccuracyPoint]
    mean_absolute_error: float | None
    predicted: int


class SpendRow(Report):
    """GPU-hours one backend was held over the period, and their cost."""

    model: str | None
    method: str | None
    gpu_type: str | None
    gpu_count: int  # in force while these hours were held
    backend: str
    gpu_hours: float
    usd: float | None  # None: no price of the asked kind for its GPU type
    usd_per_gpu_hour: float | None


class SpendReport(Report):
    """Actual spend: GPU-hours each backend was held (idle included) times its price."""

    start: str = Field(alias="from")  # ISO 8601, UTC
    end: str = Field(alias="to")
    price_kind: str
    data: list[SpendRow]
    gpu_hours: float
    total_usd: float | None  # None: some GPU-hours have no price of the asked kind
    unpriced_gpu_hours: float


class SavingsRow(Report):
    """Ledger totals of one group (model, method, key or backend) over a period."""

    model: str | None = None
    method: str | None = None
    key: int | None = None
    backend: str | None = None
    requests: int
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    baseline_cost_usd: float
    savings_usd: float


class SavingsReport(Report):
    """Capacity cost against plain decoding per group, from the hourly rollups."""

    start: str = Field(alias="from")  # ISO 8601, UTC
    end: str = Field(alias="to")
    group_by: list[str]
    data: list[SavingsRow]
