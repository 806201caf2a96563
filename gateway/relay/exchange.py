"""One request as the relay sees it: its key's limits, and settling it (ledger and metrics).

Every call on the per-key limiter is made here: the admission, which reserves a request's
worst-case tokens and cost against its key, and the settlement, which replaces the
reservation with the actual tokens and cost once the request ends.
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gateway.accounting import Ledger
from gateway.errors import GatewayError
from gateway.ledger_entry import UsageEntry
from gateway.limits import Limiter, Reservation
from gateway.metrics import GatewayMetrics
from gateway.policy.affinity import Affinity
from gateway.policy.choices import Choices
from gateway.policy.rules import RuleView
from gateway.registry import BackendState, BackendView, KeyView, Snapshot
from gateway.relay.checks import (
    completion_worst_case,
    prompt_estimate,
    sequences,
    worst_case_tokens,
)
from gateway.relay.pricing import UNKNOWN_MODEL, Costs, gpu_time_usd, price
from gateway.usage import Speculation, Tokens, tokens_of

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from gateway.relay.fairshare import Ticket
    from gateway.relay.transcripts import Sample

# A model with no throughput curve is charged its share of the backend's GPU time; before it
# runs, its worst case assumes one stream alone on the GPUs at this many seconds per token
# (20 tokens/s: slower than any interactive serving, so a reservation rarely falls short).
UNPRICED_RESERVE_S_PER_TOKEN = 0.05
NO_CHOICES = Choices()


@dataclass
class Exchange:
    """What the ledger and metrics need to know about one request."""

    request_id: str  # the client's x-request-id, or one made here; echoed and forwarded
    ledger_id: str = field(default_factory=lambda: uuid.uuid4().hex)  # unique per record
    started: float = field(default_factory=time.perf_counter)
    created_at: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.UTC))
    model: str | None = None
    # The registry as this request sees it, read once (with `model`): auth, spend, routing
    # and pricing all agree even when a refresh replaces the registry's snapshot meanwhile.
    snapshot: Snapshot | None = None
    choices: Choices = NO_CHOICES  # the selector's, read with the snapshot: routing agrees too
    key: KeyView | None = None
    end_user: str | None = None  # who it is attributed to beside its key (attribution.py)
    tags: str | None = None
    endpoint: str | None = None
    backend: BackendView | None = None
    method: str | None = None
    status: int = 0
    outcome: str = "ok"
    first_byte: float | None = None
    last_byte: float | None = None
    chunks: int = 0
    concurrency: float | None = None
    usage: dict[str, Any] | None = None
    responded: bool = False  # the whole response was handed to the server
    reservation: Reservation | None = None  # held against the key until settled
    team_reservation: Reservation | None = None  # and against its team, where it has limits
    sent: float | None = None  # when the last attempt went to its backend (perf counter)
    tokens_estimated: bool = False  # usage is the gateway's estimate, not the backend's
    costs: Costs | None = None  # priced once the usage is known
    forward: dict[str, str] = field(default_factory=dict)  # client headers passed upstream
    rule: RuleView | None = None  # the policy rule that picked the method, if one did
    # x-draftgate-class, else the key's, else the default; None until it is known
    request_class: str | None = None
    affinity: Affinity | None = None  # its session key, when it has one and affinity is on
    affinity_outcome: str | None = None  # "home", "spilled" or "stored" (routing.Route)
    attempts: int = 0  # backends tried so far
    fallback: str | None = None  # why routing left the policy's method, when it did
    speculation: Speculation | None = None  # its own drafts and accepts, where reported
    explored: bool = False  # sent to another method for its measurements (explore_fraction)
    span: Span | None = None  # its trace span, when tracing is on
    home: BackendView | None = None  # the backend holding its `previous_response_id`, if any
    response_id: str | None = None  # the id of the response its backend stored, if any
    refusal: str | None = None  # why it was refused before its body was read (no record)
    sample: Sample | None = None  # its answer as served, sampled for the lossless watchdog
    pinned: str | None = None  # the only method that may serve it (a watchdog's replay)
    priority: int | None = None  # its class's or team's (lower first), once its class is known
    ticket: Ticket | None = None  # its place among its model's backends (fair share)


def admit(
    x: Exchange,
    path: str,
    payload: dict[str, Any],
    body_bytes: int,
    states: Mapping[str, BackendState],
    default_limit: int,
    limiter: Limiter,
    metrics: GatewayMetrics,
) -> None:
    """Reserve the request's worst-case tokens and cost against its key, or refuse it.

    The worst case is worked out only for a key with a token limit or a budget: the
    prompt's estimate plus every completion token it may ask for (`worst_case_tokens`, the
    model's limit being the largest `max_model_len` its backends report, else
    `default_limit`), all at the dearest output price among the model's backends at their
    current load."""
    key, snapshot, model = x.key, x.snapshot, x.model
    if key is None or snapshot is None or model is None:
        return
    # a team caller (a token's) is the team itself: reserved against once, as the key
    own_team = key.team_id is not None and not key.team_caller
    team = snapshot.teams.get(key.team_id) if own_team and key.team_id is not None else None
    tokens, usd = 0, 0.0
    subjects = (key,) if team is None else (key, team)
    if any(s.tokens_per_minute is not None or s.budget_usd is not None for s in subjects):
        backends = snapshot.backends.get(model, ())
        limits = [m for b in backends if (m := states[b.name].max_model_len)]
        tokens = worst_case_tokens(path, payload, body_bytes, max(limits, default=default_limit))
        if any(s.budget_usd is not None for s in subjects):
            usd = max((_worst_usd(snapshot, model, b, states[b.name], tokens) for b in backends),
                      default=0.0)  # fmt: skip
    spent = snapshot.key_spend_usd
    try:
        x.reservation = limiter.admit(key, spent.get(key.id, 0.0), tokens, usd)
        if team is not None:
            x.team_reservation = _admit_team(limiter, team, spent, tokens, usd, x.reservation)
    except GatewayError as refusal:
        metrics.rejections.labels(refusal.code).inc()
        if key.team_caller:
            refusal.message = f"Team `{key.name}`: {refusal.message}"
        raise


def _admit_team(
    limiter: Limiter,
    team: KeyView,
    spent: Mapping[int, float],
    tokens: int,
    usd: float,
    held: Reservation,
) -> Reservation:
    """Reserve the request against its key's team too; refused, its key's reservation is
    released and the refusal names the team."""
    try:
        return limiter.admit(team, spent.get(team.id, 0.0), tokens, usd)
    except GatewayError as refusal:
        limiter.release(held)
        refusal.message = f"Team `{team.name}`: {refusal.message}"
        raise


def _worst_usd(
    snapshot: Snapshot, model: str, backend: BackendView, state: BackendState, tokens: int
) -> float:
    """`tokens` all at this backend's output price at its load with this request added
    (prompt tokens cost less); by GPU time at the slow floor where it has no curve."""
    per_mtok = snapshot.output_usd_per_mtok(model, backend.method, backend, state.load() + 1)
    if per_mtok is not None:
        return tokens * per_mtok / 1e6
    return gpu_time_usd(snapshot, backend, tokens * UNPRICED_RESERVE_S_PER_TOKEN, 1.0) or 0.0


def estimate_abandoned(
    x: Exchange, path: str, payload: dict[str, Any], body_bytes: int, limit: int
) -> None:
    """The usage of a non-streamed request whose backend never answered it (its client left,
    or the read timeout passed; vLLM says what it generated only in the whole response): the
    prompts' estimate, and the time it ran on its backend, less the prompts' prefill, at the
    per-sequence rate of the curve that prices it at its load (curve tokens/s over the load,
    its own sequences included: every prompt of a list, `n` or `best_of` times), at most the
    completion tokens it asked for. Recorded as estimated."""
    snapshot, backend = x.snapshot, x.backend
    if snapshot is None or backend is None or x.method is None or x.model is None:
        return
    if x.sent is None or x.usage is not None:
        return
    prompt = prompt_estimate(path, payload, body_bytes, limit)
    cap, each = completion_worst_case(path, payload, limit), sequences(path, payload)
    key, c = (x.model, x.method, backend.gpu_type), max(x.concurrency or 1.0, 1.0) + each - 1
    curve, prefill = snapshot.curves.get(key), snapshot.prefill.get(key)
    running_s = time.perf_counter() - x.sent - prompt * (prefill.s_per_token if prefill else 0)
    completion = 0
    if curve is not None and running_s > 0:
        completion = min(int(running_s * curve.at(c) * backend.gpu_count * each / c), cap)
    x.usage = {"prompt_tokens": prompt, "completion_tokens": completion}
    x.tokens_estimated = True


def settle(x: Exchange, ledger: Ledger, limiter: Limiter, metrics: GatewayMetrics) -> None:
    """Exactly one ledger record and the metrics of a finished request; its reservation is
    released whatever else fails (a key's slots and held budget must not leak)."""
    if x.model is None or x.snapshot is None:  # refused before the model was known
        metrics.rejections.labels(x.refusal or "malformed").inc()
        return
    tokens = tokens_of(x.usage)
    cost: float | None = None
    try:
        cost = _record(x, x.model, x.snapshot, tokens, ledger, metrics)
    finally:
        for held in (x.reservation, x.team_reservation):
            if held is not None:
                limiter.settle(held, tokens.prompt + tokens.completion, cost)


def _record(
    x: Exchange,
    model: str,
    snapshot: Snapshot,
    tokens: Tokens,
    ledger: Ledger,
    metrics: GatewayMetrics,
) -> float | None:
    """Write the request's ledger record and metrics; its cost."""
    prompt, completion = tokens.prompt, tokens.completion
    for name in tokens.rejected:  # set aside, counted: the record itself is kept
        metrics.usage_rejected.labels(name).inc()
    latency = time.perf_counter() - x.started
    costs = x.costs or price(x, tokens, latency, metrics)
    cost, baseline = costs.cost, costs.baseline
    ttft = None if x.first_byte is None else x.first_byte - x.started
    method = x.method or "none"
    ledger.record(
        UsageEntry(
            request_id=x.ledger_id,
            client_request_id=x.request_id,
            created_at=x.created_at,
            api_key_id=x.key.api_key_id if x.key else None,
            model=model if model in snapshot.backends else UNKNOWN_MODEL,
            method=x.method,
            backend_name=x.backend.name if x.backend else None,
            prompt_tokens=prompt,
            completion_tokens=completion,
            cached_prompt_tokens=tokens.cached,
            status_code=x.status,
            outcome=x.outcome,
            latency_ms=latency * 1000,
            ttft_ms=None if ttft is None else ttft * 1000,
            concurrency=x.concurrency,
            cost_usd=cost,
            baseline_cost_usd=baseline,
            curve_source=costs.source,
            cost_error_usd=costs.cost_error,
            baseline_error_usd=costs.baseline_error,
            prompt_usd_per_mtok=costs.prompt_usd_per_mtok,
            tokens_estimated=x.tokens_estimated,
            response_id=x.response_id,
            spec_steps=x.speculation.steps if x.speculation else None,
            draft_tokens=x.speculation.drafted if x.speculation else None,
            accepted_tokens=x.speculation.accepted if x.speculation else None,
            request_class=x.request_class,
            acceptance_factor=costs.acceptance_factor,
            drafter_factor=costs.drafter_factor,
            context_usd=costs.context_usd,
            baseline_context_usd=costs.baseline_context_usd,
            rule_index=x.rule.index if x.rule is not None else None,
            drafter=x.backend.drafter if x.backend else None,
            team_id=x.key.team_id if x.key else None,
            end_user=x.end_user,
            tags=x.tags,
            endpoint=x.endpoint,
        )
    )
    _observe(snapshot, metrics, x, method, latency, ttft, prompt, completion, cost, baseline)
    return cost


def _observe(
    snapshot: Snapshot,
    metrics: GatewayMetrics,
    x: Exchange,
    method: str,
    latency: float,
    ttft: float | None,
    prompt: int,
    completion: int,
    cost: float | None,
    baseline: float | None,
) -> None:
    m, model = metrics, x.model or ""
    if model not in snapshot.backends:
        model = UNKNOWN_MODEL  # labels only ever carry the registry's model names
    m.series(m.requests, model, method, f"{x.status // 100}xx").inc()
    if x.outcome == "client_stalled":
        m.clients_cut.labels(model).inc()
    m.series(m.latency, model, method).observe(latency)
    if ttft is not None and x.chunks:
        m.series(m.ttft, model, method).observe(ttft)
    if x.chunks > 1 and x.first_byte is not None and x.last_byte is not None:
        m.series(m.itl, model, method).observe((x.last_byte - x.first_byte) / (x.chunks - 1))
    if prompt:
        m.series(m.tokens, model, method, "prompt").inc(prompt)
    if completion:
        m.series(m.tokens, model, method, "completion").inc(completion)
    if cost is not None:
        m.series(m.cost, model, method).inc(cost)
        if baseline is not None:
            m.series(m.baseline_cost, model, method).inc(baseline)
