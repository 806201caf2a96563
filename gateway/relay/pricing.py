"""What a request costs: its output at its curve's price (its drafter's, its class's
acceptance), corrected to its own context, its prompt at the prefill price, and plain
decoding's cost of the same request beside it, each with its 95% half-width; by its share of
the backend's GPU time where it has no curve (docs/costs.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from gateway.drafters import drafter_factor
from gateway.metrics import GatewayMetrics
from gateway.registry import BackendView, Snapshot
from gateway.usage import Speculation, Tokens

# A name no backend serves is the client's to choose: its refusals are recorded under this
# one name (as /metrics labels them), never under theirs.
UNKNOWN_MODEL = "unknown"
GPU_TIME = "gpu_time"  # the curve source of a request charged by GPU time


class Priced(Protocol):
    """What pricing reads of a request (gateway/relay/exchange.py's Exchange)."""

    model: str | None
    snapshot: Snapshot | None
    backend: BackendView | None
    method: str | None
    concurrency: float | None
    request_class: str | None
    speculation: Speculation | None
    costs: Costs | None


def gpu_time_usd(
    snapshot: Snapshot, backend: BackendView, seconds: float, concurrency: float
) -> float | None:
    """A request's share of its backend's GPU time: `seconds` among `concurrency` others."""
    price = snapshot.prices.get(backend.gpu_type)
    if price is None:
        return None
    return price * backend.gpu_count * seconds / max(concurrency, 1.0) / 3600


@dataclass(frozen=True, slots=True)
class Costs:
    """A request's capacity cost and plain decoding's at the same load, each with its 95%
    half-width from its curve's band; the prompt price applied to both; the source of the
    cost's curve at that load."""

    cost: float | None = None
    baseline: float | None = None
    cost_error: float | None = None
    baseline_error: float | None = None
    source: str | None = None
    prompt_usd_per_mtok: float | None = None
    acceptance_factor: float | None = None  # its class's price over the method's average
    drafter_factor: float | None = None  # its drafter's price over the method's curve
    # its context's correction, included in the cost and in the baseline (gateway/context.py)
    context_usd: float | None = None
    baseline_context_usd: float | None = None


def price(x: Priced, tokens: Tokens, latency_s: float, metrics: GatewayMetrics) -> Costs:
    """The request's costs, kept on the exchange (a response header or a stream's last
    comment may show them first)."""
    if x.costs is None:
        x.costs = _costs(x, tokens, latency_s, metrics)
    return x.costs


def _costs(x: Priced, tokens: Tokens, latency_s: float, metrics: GatewayMetrics) -> Costs:
    """Output tokens at the curve's $/1M with its own prefill taken out, corrected to the
    request's own context (gateway/context.py), the prompt tokens not read from the prefix
    cache at the prefill price (the same for plain, so prompts never change a saving; a
    cache hit skipped its prefill). Without a curve, the request's share of the backend's
    GPU time: never free, never a saving."""
    snapshot, prompt, completion = x.snapshot, tokens.prompt, tokens.completion
    if x.backend is None or x.method is None or x.model is None or snapshot is None:
        return Costs()
    c, gpu = x.concurrency or 1.0, x.backend.gpu_type
    if (x.model, x.method, gpu) not in snapshot.curves:
        return _unpriced(x, snapshot, x.backend, prompt + completion, latency_s, metrics)
    per_prompt = snapshot.prompt_usd_per_mtok(x.model, x.method, gpu)
    if not completion and not (prompt and per_prompt):
        return Costs()
    prompt_usd = (prompt - (tokens.cached or 0)) * (per_prompt or 0.0) / 1e6
    price = _output_price(snapshot, x.model, x.method, x.backend, x.request_class or "", c)
    plain = snapshot.output_usd_per_mtok(x.model, "plain", x.backend, c)
    output = None if price.per_output is None else completion * price.per_output / 1e6
    base_output = None if plain is None else completion * plain / 1e6
    steps = x.speculation.steps if x.speculation is not None else None
    extra, extra_95 = _context_usd(snapshot, (x.model, x.method, gpu), tokens, steps, c, output)
    base, base_95 = _context_usd(snapshot, (x.model, "plain", gpu), tokens, None, c, base_output)
    cost = None if output is None else output + extra + prompt_usd
    baseline = None if base_output is None else base_output + base + prompt_usd
    error = _error(None if output is None else output + prompt_usd, price.relative)
    plain_relative = snapshot.relative_95(x.model, "plain", gpu, c)
    baseline_error = _error(
        None if base_output is None else base_output + prompt_usd, plain_relative
    )
    return Costs(
        cost,
        baseline,
        None if error is None else error + extra_95,
        None if baseline_error is None else baseline_error + base_95,
        None if cost is None else price.source,
        per_prompt if cost is not None else None,
        price.class_factor if cost is not None else None,
        price.drafter_factor if cost is not None else None,
        extra if cost is not None else None,
        base if baseline is not None else None,
    )


@dataclass(frozen=True, slots=True)
class OutputPrice:
    """What one output token of a request costs before its context: the curve's $/1M (its
    drafter's where two drafters serve, its class's acceptance where it has its own), the
    relative 95% half-width, the curve's source at its load, and the factors applied."""

    per_output: float | None
    relative: float | None
    source: str | None
    class_factor: float | None = None
    drafter_factor: float | None = None


def _output_price(
    snapshot: Snapshot, model: str, method: str, backend: BackendView, kind: str, c: float
) -> OutputPrice:
    """A request's output price on its backend at load c, before its context."""
    per_output = snapshot.output_usd_per_mtok(model, method, backend, c)
    gpu = backend.gpu_type
    relative = snapshot.relative_95(model, method, gpu, c)
    source = snapshot.curve_source(model, method, gpu, c)
    drafter = snapshot.drafters.get((model, method, gpu, backend.drafter or ""))
    factor = None
    if drafter is not None and per_output is not None:  # its drafter's own curve, not the mix
        factor = drafter_factor(snapshot.curves[(model, method, gpu)], drafter, c)
        per_output *= factor
        relative, source = drafter.band.relative_95(c), drafter.band.source(c)
    own = snapshot.class_prices.get((model, method, kind))
    if own is not None and per_output is not None:  # its class's acceptance, not the average
        per_output *= own.factor
        relative = math.hypot(relative or 0.0, own.relative_95)  # independent errors
    class_factor = own.factor if own is not None else None
    return OutputPrice(per_output, relative, source, class_factor, factor)


def _context_usd(
    snapshot: Snapshot,
    key: tuple[str, str, str],
    tokens: Tokens,
    steps: int | None,
    c: float,
    output_usd: float | None,
) -> tuple[float, float]:
    """A request's context correction on a curve (gateway/context.py) and its 95%
    half-width: over its own verify steps where reported, else its output over the
    curve's acceptance; 0 where the curve has no context model or the output no price."""
    context, price = snapshot.context.get(key), snapshot.prices.get(key[2])
    if context is None or price is None or output_usd is None or not tokens.completion:
        return 0.0, 0.0
    mine = tokens.prompt + tokens.completion / 2
    n = steps if steps else tokens.completion / context.acceptance
    usd = context.usd(mine, n, c, price, output_usd)
    return usd, abs(usd) * snapshot.bands[key].estimated


def _unpriced(
    x: Priced,
    snapshot: Snapshot,
    backend: BackendView,
    tokens: int,
    latency_s: float,
    metrics: GatewayMetrics,
) -> Costs:
    if not tokens:
        return Costs()
    model = x.model if x.model in snapshot.backends else UNKNOWN_MODEL
    cost = gpu_time_usd(snapshot, backend, latency_s, x.concurrency or 1.0)
    metrics.unpriced.labels(model, "no_price" if cost is None else GPU_TIME).inc()
    if cost is None:
        return Costs()
    # The load is an estimate over the request's life: its share is known to within 2x.
    return Costs(cost, cost, cost, cost, GPU_TIME)


def _error(cost: float | None, relative: float | None) -> float | None:
    return None if cost is None or relative is None else cost * relative
