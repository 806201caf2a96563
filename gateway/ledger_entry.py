"""One request as the usage ledger records it (gateway/accounting.py writes it, and
gateway/rollups.py sums it into the hourly rollups)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, fields


@dataclass(slots=True)
class UsageEntry:
    """One request as the ledger records it."""

    request_id: str  # unique, made by the gateway
    client_request_id: str | None
    created_at: dt.datetime
    api_key_id: int | None
    model: str
    method: str | None
    backend_name: str | None
    prompt_tokens: int
    completion_tokens: int
    status_code: int
    outcome: str  # ok, client_error, upstream_error, client_disconnect, client_stalled, rejected
    latency_ms: float
    ttft_ms: float | None
    concurrency: float | None
    cost_usd: float | None
    baseline_cost_usd: float | None
    curve_source: str | None = None  # measured / estimated / gpu_time; None when not priced
    # 95% half-widths of cost_usd and baseline_cost_usd, from their curves' bands
    cost_error_usd: float | None = None
    baseline_error_usd: float | None = None
    # The $/1M prompt tokens both costs include (None: prompts unpriced)
    prompt_usd_per_mtok: float | None = None
    tokens_estimated: bool = False  # the counts are the gateway's estimate, not the backend's
    # Of the prompt tokens, those the backend read from its prefix cache (None: not said)
    cached_prompt_tokens: int | None = None
    # The id of the response the backend stored (the Responses API), so a later turn finds it
    response_id: str | None = None
    # Its own speculative decoding, where the engine reported it (vLLM's per-request spec
    # decode metrics): verify steps, draft tokens proposed and accepted; None: not reported
    spec_steps: int | None = None
    draft_tokens: int | None = None
    accepted_tokens: int | None = None
    request_class: str | None = None  # None: refused before its class was known
    rule_index: int | None = None  # the policy rule that routed it, by position; None: none
    # Its class's acceptance priced it: the method's $/1M output times this (None: the average)
    acceptance_factor: float | None = None
    drafter: str | None = None  # the drafter of the backend that served it
    # Its drafter's own windows priced it: the curve's $/1M output times this (None: the curve)
    drafter_factor: float | None = None
    # Its own context's correction (gateway/context.py), included in cost_usd and in
    # baseline_cost_usd (None: not priced at its context)
    context_usd: float | None = None
    baseline_context_usd: float | None = None
    # Who it is attributed to: its key's team, its end user, its tags (",a,b,"), its path
    team_id: int | None = None
    end_user: str | None = None
    tags: str | None = None
    endpoint: str | None = None


ENTRY_FIELDS = tuple(f.name for f in fields(UsageEntry))
