"""The shapes of the admin API's reports: plan, accuracy, spend and savings (read-only)."""

# Over 400 lines: every read-only report shape of the admin API, one contract.

from __future__ import annotations

import datetime as dt
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field


def _utc(value: dt.datetime) -> dt.datetime:
    """A time given without an offset (a bare `2026-01-01` too) is UTC, as stored."""
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)


# A report's `from` and `to`: ISO 8601, with an offset or in UTC
Instant = Annotated[dt.datetime, AfterValidator(_utc)]


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
    usd_per_mtok_95: tuple[float, float]  # usd_per_mtok x (1 -+ the fit's relative_95)
    measured_output_tokens_per_s: float | None  # all GPUs of the plan, when measured
    source: Literal["measured", "estimated"]
    # The model whose published acceptance priced this point, when none is published or
    # measured for this one with this method; such a method is ranked only when no other is.
    acceptance_borrowed_from: str | None = None


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
    # Sized with the replica at the fast and the slow end of the fit's interval
    usd_per_month_95: tuple[float, float] | None  # None: the slow end has no throughput


class CapacityPlan(Report):
    """GPUs and $/month per method for a traffic, with savings against plain and EAGLE-3."""

    output_tokens_per_s: float
    itl_objective_ms: float
    methods: list[MethodCapacity]
    savings_usd_per_month: dict[str, dict[str, float]]  # vs_plain, vs_eagle3: by method
    savings_usd_per_month_95: dict[str, dict[str, tuple[float, float] | None]]


class PlanFit(Report):
    """How many measurements the plan was fitted to, and its held-out error."""

    measurements: int
    error_band: float | None  # mean |prediction / measurement - 1| on held-out points
    # The relative 95% half-width of every predicted throughput and $ figure: 2.45 x the
    # error band, never below the planner's calibration error; without a band (fewer than
    # two measurements), 2.45 x its mean error on sweeps it was not calibrated on
    relative_95: float


class PlanReport(Report):
    """Per concurrency, the best method and K within the ITL objective, and its cost."""

    fit: PlanFit
    capacity: CapacityPlan | None
    model: str
    gpu: str
    gpu_count: int
    workload: str
    engine: str  # whose scheduling and calibration the predictions assume: vllm or sglang
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
    """Ledger totals of one group (model, method, key, backend, class, rule, drafter, team,
    end user, tags or endpoint) over a period."""

    model: str | None = None
    method: str | None = None
    key: int | None = None
    backend: str | None = None
    requests: int  # served by a backend (whatever their status)
    refused: int = 0  # refused before any backend: a bad key, a limit, a malformed request
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    baseline_cost_usd: float
    savings_usd: float
    # 95% intervals: the sums of each record's half-widths (the errors of one curve move
    # together, so half-widths add), from the bands of the curves that priced them.
    cost_usd_95: tuple[float, float]
    baseline_cost_usd_95: tuple[float, float]
    savings_usd_95: tuple[float, float]
    # Prompt tokens the backends read from their prefix caches (priced at nothing), and the
    # prefill they skipped at the prompt price each request was given: what cache hits (and
    # the session affinity that brings them) avoided in capacity cost, not money released.
    # Prefill is the same for every method, so it is in no saving above.
    cached_prompt_tokens: int
    prefill_saved_by_cache_usd: float
    request_class: str | None = None  # group_by=class
    rule: int | None = None  # group_by=rule: the policy rule's position; None: no rule
    drafter: str | None = None  # group_by=drafter: the serving backend's; None: none
    team: int | None = None  # group_by=team: its key's team's id; None: none
    end_user: str | None = None  # group_by=user: the end user it named; None: none
    tags: str | None = None  # group_by=tags: its set of tags, `,a,b,`; None: none
    endpoint: str | None = None  # group_by=endpoint: its path
    # The group's own speculative decoding, over the requests whose engine reported it
    # (vLLM's per-request spec decode metrics): their acceptance length 1 + accepted / steps
    # with its 95% interval (a ratio estimator over those requests); None: none reported.
    spec_requests: int = 0
    spec_steps: int = 0
    accepted_tokens: int = 0
    acceptance_length: float | None = None
    acceptance_length_95: tuple[float, float] | None = None


class SavingsReport(Report):
    """Capacity cost against plain decoding per group over exactly [from, to): whole hours
    from the hourly rollups, the partial hours at the edges from the records."""

    start: str = Field(alias="from")  # ISO 8601, UTC
    end: str = Field(alias="to")
    group_by: list[str]
    data: list[SavingsRow]


class FleetTraffic(Report):
    """One hour of a model's traffic, from the hourly rollups."""

    hour: str  # ISO 8601 start of the UTC hour
    hours: float  # the part of it inside the period while the model was held (0..1)
    requests: int
    input_tokens: int
    output_tokens: int
    output_tokens_per_s: float  # output tokens over the seconds of the hour it was served
    mean_concurrency: float  # request-seconds in flight over those seconds (Little's law)


class FleetObjective(Report):
    """What the fleets are sized for: the model's ITL objective, or throughput alone."""

    itl_ms: float | None
    sized_for: Literal["itl objective", "what-if itl objective", "throughput alone"]
    # Without an objective: the loosest ITL objective (ms per token, on a grid of quarter
    # octaves) under which a speculative method's right-sized bill is below plain's.
    speculation_pays_below_itl_ms: float | None


class FleetActual(Report):
    """The bill: GPU-hours the model's backends were held, idle included, times price."""

    gpu_hours: float
    spend_usd: float | None  # None: some of those GPU-hours have no price of the kind


class FleetMethod(Report):
    """A fleet of one method sized hour by hour for the model's traffic."""

    method: str
    k: int
    gpu_type: str
    gpu_count: int  # GPUs per replica
    concurrency_per_replica: float  # streams a replica runs at within the objective
    output_tokens_per_s_per_replica: float
    itl_ms: float  # at that concurrency
    meets_objective: bool  # False: not even one stream meets it (sized at one stream)
    source: Literal["measured", "estimated"]  # the operating point within measured points?
    relative_95: float  # the curve's 95% half-width there (GET /admin/v1/curves' band)
    peak_replicas: int
    gpu_hours: float
    usd_per_gpu_hour: float | None
    bill_usd: float | None  # the right-sized bill; None without a price
    # The bill sized with the replica at the fast and the slow end of that interval; None
    # without a price, or when the slow end has no throughput (an estimate of +-100%)
    bill_usd_95: tuple[float, float] | None


class FleetAuto(Report):
    """Each hour on the method cheapest for it (what the `auto` policy aims for)."""

    gpu_hours: float
    bill_usd: float
    bill_usd_95: tuple[float, float] | None  # every pool at the fast, then the slow end
    hours_by_method: dict[str, int]


class FleetLatency(Report):
    """What speculation buys on the fleet one has: ITL served vs plain's at the same load."""

    method: str
    output_tokens: int
    concurrency_per_backend: float  # mean streams in flight per backend, token-weighted
    itl_ms: float  # the method's curve at that load
    plain_itl_ms: float | None  # plain's curve at the same load
    speedup_vs_plain: float | None  # plain_itl_ms / itl_ms


class FleetNow(Report):
    """The model's load now (this gateway replica's view) and the replicas each pool wants."""

    concurrency: float  # requests in flight, smoothed as the selector smooths them
    output_tokens_per_s: float  # that load's output throughput, from the curves
    routed_method: str | None  # the method the policy routes to now
    desired_replicas: dict[str, int]  # per method pool; `draftgate_desired_replicas`


class FleetReport(Report):
    """The bill, the right-sized bill per method, achievable savings and over-provisioning."""

    model: str
    start: str = Field(alias="from")
    end: str = Field(alias="to")
    price_kind: str
    headroom: float
    min_replicas: int
    # the replicas a pool the policy does not route to keeps (DRAFTGATE_IDLE_POOL_REPLICAS):
    # the floor under the idle pools in `now.desired_replicas`
    idle_pool_replicas: int
    traffic: list[FleetTraffic]
    objective: FleetObjective
    actual: FleetActual
    methods: list[FleetMethod]
    best: str | None  # the method with the lowest right-sized bill that meets the objective
    auto: FleetAuto | None
    achievable_savings_usd: float | None  # plain's right-sized bill - best's
    achievable_savings_usd_95: tuple[float, float] | None  # the ends of the two bills
    served_bill_usd: float | None  # right-sized bill of the methods as they were served
    served_bill_usd_95: tuple[float, float] | None
    over_provisioning_usd: float | None  # actual spend - served_bill_usd
    over_provisioning_usd_95: tuple[float, float] | None  # actual spend is a bill: exact
    latency: list[FleetLatency]  # the latency gain at the fleet one has, per served method
    now: FleetNow | None


class CurvePoint(Report):
    """A pooled measured point of a curve: the windows, sweep levels and imports in one
    concurrency bin at the curve's K, weighted by the requests behind each."""

    concurrency: float
    output_tokens_per_s: float  # per GPU
    requests: int
    points: int  # measurements pooled
    relative_spread: float  # request-weighted standard deviation of tokens/s over the mean
    # 95% interval of the pooled mean, relative (1.96 x spread / sqrt(points)); None with
    # one point: a single measurement says nothing of its own noise.
    relative_interval_95: float | None
    acceptance_length: float | None
    sources: list[str]


class CurveLinePoint(Report):
    """A point of the line that prices requests: measured (a pooled point) or estimated
    (the planner's prediction scaled to meet the measured points)."""

    concurrency: float
    output_tokens_per_s: float  # per GPU
    usd_per_mtok: float | None  # capacity cost at this load, at the on-demand price
    # The same with the curve's prefill taken out: what a request pays per output token,
    # its prompt priced apart (equal to usd_per_mtok where prompts are unpriced)
    output_usd_per_mtok: float | None
    # Relative 95% half-width of the throughput, and to first order of the $/1M, from the
    # curve's band: a measured point's windows, or the planner's error for an estimate.
    relative_95: float
    usd_per_mtok_95: tuple[float, float] | None  # usd_per_mtok x (1 -+ relative_95)
    source: Literal["measured", "estimated"]


class ContextSlope(Report):
    """The planner's step-time slope at one concurrency of a curve (gateway/context.py)."""

    concurrency: float
    s_per_context_token: float  # seconds of step per context token of one sequence
    kv_share: float  # the share of a step that is the sequences' KV reads


class ContextModel(Report):
    """What prices a request at its own context on this curve (docs/costs.md): its
    `context_usd` = max((x - mean_context_tokens) x s_per_context_token(c) x steps x
    usd_per_gpu_hour / 3600, -kv_share(c) x its output cost), x its prompt plus half its
    answer, steps its own verify steps or its output over `acceptance_length`; the slope
    interpolated in log(concurrency) between these points."""

    mean_context_tokens: float
    acceptance_length: float
    slope: list[ContextSlope]


class DrafterLine(Report):
    """Where two drafters of the curve's method serve side by side: one drafter's own curve,
    from its windows alone, which prices its requests (the method's line times the ratio of
    the two lines at the request's load; gateway/drafters.py). Two drafters' lines compare
    at the same concurrency; their requests' costs also carry each side's own load."""

    drafter: str
    measured: list[CurvePoint]
    line: list[CurveLinePoint]
    estimated_relative_95: float


class Curve(Report):
    """One (model, method, GPU type) curve as the gateway prices requests with it now."""

    model: str
    method: str
    k: int
    gpu_type: str
    usd_per_gpu_hour: float | None  # the on-demand price applied; None when unpriced
    measured: list[CurvePoint]
    line: list[CurveLinePoint]
    # The relative 95% half-width wherever the line is an estimate (past the measured points)
    estimated_relative_95: float
    # Prompts: the $/1M prompt tokens cost to prefill (the planner's prefill model; None for
    # a model it has no spec for, whose prompts are unpriced), and the prompt tokens per
    # output token of the traffic the line was measured (else predicted) at
    prompt_usd_per_mtok: float | None
    prompt_tokens_per_output_token: float | None
    # measurements kept out of it: superseded (another drafter or engine version), shape,
    # outlier, noise
    rejected: dict[str, int]
    drafters: list[DrafterLine] = []  # empty: one drafter (or none) serves the method
    context: ContextModel | None = None  # None: the planner does not know the model or GPU


class CurvesReport(Report):
    """The curves that price live requests, drive `auto`, size the fleet and are drawn."""

    price_kind: str
    curves: list[Curve]


class UsageRow(Report):
    """One request as the ledger recorded it, with the prices applied to it: cost_usd is
    (completion_tokens x usd_per_mtok + (prompt_tokens - cached_prompt_tokens) x
    prompt_usd_per_mtok) / 1e6, where usd_per_mtok is its method's curve at its concurrency
    on its backend's GPU type with the curve's own prefill taken out (`output_usd_per_mtok`
    of GET /admin/v1/curves' line), and a null cached_prompt_tokens counts as 0."""

    id: int
    request_id: str
    client_request_id: str | None
    created_at: dt.datetime
    api_key_id: int | None
    model: str
    method: str | None
    backend: str | None
    prompt_tokens: int
    # Of them, read from the backend's prefix cache: no prefill, not priced (None: the
    # backend did not say, as vLLM without --enable-prompt-tokens-details)
    cached_prompt_tokens: int | None
    completion_tokens: int
    status_code: int
    outcome: str
    latency_ms: float
    ttft_ms: float | None
    concurrency: float | None  # the load its backend was under, which priced it
    usd_per_mtok: float | None  # per output token, applied; None when not priced
    baseline_usd_per_mtok: float | None  # plain decoding's, at the same load
    prompt_usd_per_mtok: float | None  # per prompt token, in both costs; None: unpriced
    cost_usd: float | None
    baseline_cost_usd: float | None
    curve_source: str | None  # measured / estimated / gpu_time (no curve: its GPU-time share)
    # 95% half-widths of the two costs, from their curves' bands at that load
    cost_error_usd: float | None
    baseline_error_usd: float | None
    # The token counts are the gateway's estimate (a non-streamed request its client left:
    # the time it ran at its curve's per-request rate), not what the backend reported
    tokens_estimated: bool = False
    # Its own speculative decoding, where the engine reported it (vLLM's
    # --per-request-spec-decode-metrics): verify steps, draft tokens proposed and accepted,
    # and its acceptance length 1 + accepted / steps; None: not reported
    spec_steps: int | None = None
    draft_tokens: int | None = None
    accepted_tokens: int | None = None
    acceptance_length: float | None = None
    request_class: str | None = None  # None: refused before its class was known
    rule: int | None = None  # the position of the policy rule that routed it; None: none
    # Priced from its class's own acceptance: usd_per_mtok is its curve's times this, the
    # method's mean acceptance length over the class's (GET /admin/v1/savings?group_by=
    # model,method,class shows both); None: priced at the method's average
    acceptance_factor: float | None = None
    drafter: str | None = None  # the drafter of the backend that served it
    # Priced from its drafter's own windows (two drafters of the method serving side by side):
    # usd_per_mtok is its curve's times this (GET /admin/v1/curves shows each drafter's
    # factor); None: priced at the curve
    drafter_factor: float | None = None
    # Its own context's correction (gateway/context.py; docs/costs.md), already in cost_usd
    # and usd_per_mtok (baseline_context_usd in baseline_cost_usd): signed, a context longer
    # than its curve's traffic's pays more; None where none applied
    context_usd: float | None = None
    baseline_context_usd: float | None = None
    # Who it is attributed to (docs/teams.md): its key's team when it was served, the end
    # user it named, its tags (`,a,b,`) and its endpoint (path)
    team_id: int | None = None
    end_user: str | None = None
    tags: str | None = None
    endpoint: str | None = None


class UsagePage(Report):
    """A page of usage records, oldest first; pass `next_cursor` as `cursor` for the next."""

    object: Literal["list"] = "list"
    data: list[UsageRow]
    next_cursor: str | None


class FirstDivergence(Report):
    """Where diverged answers first left their replays: `common_prefix` over a group's
    diverged checks, in linearly interpolated quantiles."""

    unit: str = Field(
        description="token: ids compared; char: text compared; mixed: the group has both"
    )
    min: int = Field(description="The earliest divergence, in `unit`s from the answer's start")
    p25: float = Field(description="A quarter of the divergences come at or before this")
    p50: float = Field(description="The median divergence")
    p75: float
    max: int


class LosslessFloor(Report):
    """A model's checks of a method against itself (method == reference_method) pooled: the
    divergence batch nondeterminism alone causes, to read every group's rate beside."""

    samples: int = Field(description="Served answers compared with their replay")
    divergences: int = Field(description="Of them, those that differ from their replay")
    divergence_rate: float | None = Field(description="divergences / samples; None: no samples")
    interval_95: tuple[float, float] | None = Field(
        description="The Wilson score interval of the rate at 95%; None: no samples"
    )


class LosslessGroup(Report):
    """One serving configuration's checks against one reference method."""

    method: str = Field(description="The served answer's method")
    k: int | None = Field(description="Its speculative tokens per step; None: not speculative")
    drafter: str | None = Field(description="Its drafter; None: none")
    backend: str = Field(description="The backend that served the answer")
    engine_version: str | None = Field(description="The serving engine's version, if it said")
    reference_method: str = Field(description="The method the replay ran on")
    is_floor: bool = Field(
        description=(
            "method == reference_method: what batch nondeterminism alone makes differ, the "
            "rate every other group is read against"
        )
    )
    samples: int = Field(description="Served answers compared with their replay")
    divergences: int = Field(description="Of them, those that differ from their replay")
    by_tokens: int = Field(
        description=(
            "Of them, those compared by token ids (both engines returned them); the rest "
            "were compared as text"
        )
    )
    divergence_rate: float = Field(description="divergences / samples")
    interval_95: tuple[float, float] = Field(
        description="The Wilson score interval of the rate at 95%"
    )
    first_divergence: FirstDivergence | None = Field(
        description="Where the diverged answers first differ; None: none diverged"
    )
    first_seen: dt.datetime = Field(description="The group's first check in the period")
    last_seen: dt.datetime = Field(description="Its last check in the period")


class LosslessReplays(Report):
    """The watchdog's own cost: its replays, recorded as requests of the class
    `lossless-replay`, a capacity cost priced like any request."""

    requests: int = Field(description="Replays recorded in the period")
    unpriced: int = Field(description="Of them, those without a cost (not in cost_usd)")
    cost_usd: float = Field(
        description=(
            "Their capacity cost, priced like any request (its method's curve at its load): "
            "the share of the GPUs' time the replays took"
        )
    )


class LosslessModel(Report):
    """One model's checks: the floor, the replays' cost and each serving configuration."""

    model: str
    floor: LosslessFloor
    replays: LosslessReplays
    groups: list[LosslessGroup]


class LosslessReport(Report):
    """How often served answers differ from their replays on the reference method, per model
    and serving configuration, beside the floor, over [from, to)."""

    start: str = Field(alias="from", description="ISO 8601, UTC")
    end: str = Field(alias="to", description="ISO 8601, UTC")
    models: list[LosslessModel]
