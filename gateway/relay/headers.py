"""What the relay adds to a request and its answer: headers to a backend (the client's allowed
ones, then its own), headers to the client (where its request went, its key's limits left, a
whole response's cost), and a stream's cost as an SSE comment."""

from __future__ import annotations

import time

import orjson

from gateway.limits import Limiter
from gateway.metrics import GatewayMetrics
from gateway.registry import BackendView
from gateway.relay.exchange import Exchange
from gateway.relay.pricing import price
from gateway.relay.sse import UsageTap
from gateway.relay.upstream import UpstreamResponse
from gateway.usage import tokens_of

# Before the JSON of a stream's cost (its usage record's cost_usd, cost_error_usd and
# curve_source), when the client sent `x-draftgate-include-cost: true`.
COST_COMMENT = b": x-draftgate-cost "


def upstream_headers(x: Exchange, backend: BackendView) -> dict[str, str]:
    """The client's allowed headers, then ours: JSON, the request id, identity encoding (the
    usage tap reads the bytes as they come; a compressed stream would lose its usage) and the
    backend's own key."""
    headers = x.forward | {
        "content-type": "application/json",
        "x-request-id": x.request_id,
        "accept-encoding": "identity",
    }
    if backend.api_key:
        headers["authorization"] = f"Bearer {backend.api_key}"
    return headers


def response_headers(
    response: UpstreamResponse, backend: BackendView, fallback: str | None, x: Exchange
) -> list[tuple[bytes, bytes]]:
    headers = [
        (b"content-type", response.headers.get("content-type", "application/json").encode()),
        (b"x-draftgate-backend", backend.name.encode()),
        (b"x-draftgate-method", backend.method.encode()),
        (b"x-request-id", x.request_id.encode()),
    ]
    if fallback:
        headers.append((b"x-draftgate-fallback", fallback.encode()))
    if x.explored:  # not the policy's method: explore_fraction sent it elsewhere
        headers.append((b"x-draftgate-explored", b"true"))
    if x.rule is not None:  # its position in the policy's rules, from 0
        headers.append((b"x-draftgate-rule", b"%d" % x.rule.index))
    if x.affinity_outcome is not None:
        headers.append((b"x-draftgate-affinity", x.affinity_outcome.encode()))
    return headers


def cost_headers(x: Exchange, metrics: GatewayMetrics) -> list[tuple[bytes, bytes]]:
    """A whole response's capacity cost, its 95% half-width and the source of its price."""
    costs = price(x, tokens_of(x.usage), time.perf_counter() - x.started, metrics)
    if costs.cost is None:
        return []
    headers = [(b"x-draftgate-cost-usd", b"%.9f" % costs.cost)]
    if costs.cost_error is not None:
        headers.append((b"x-draftgate-cost-95-usd", b"%.9f" % costs.cost_error))
    if costs.source is not None:
        headers.append((b"x-draftgate-cost-source", costs.source.encode()))
    return headers


def limit_headers(x: Exchange, limiter: Limiter) -> list[tuple[bytes, bytes]]:
    """The key's limits and what is left of them this minute, as OpenAI names them
    (reservations in flight count as used)."""
    if x.key is None:
        return []
    rpm, tpm = x.key.requests_per_minute, x.key.tokens_per_minute
    requests, tokens = limiter.remaining(x.key)
    headers = []
    if rpm is not None and requests is not None:
        headers.append((b"x-ratelimit-limit-requests", b"%d" % rpm))
        headers.append((b"x-ratelimit-remaining-requests", b"%d" % requests))
    if tpm is not None and tokens is not None:
        headers.append((b"x-ratelimit-limit-tokens", b"%d" % tpm))
        headers.append((b"x-ratelimit-remaining-tokens", b"%d" % tokens))
    return headers


def cost_comment(x: Exchange, tap: UsageTap, metrics: GatewayMetrics) -> bytes:
    """The SSE comment that tells a stream's client its cost, as its usage record holds
    it (clients skip comments: the stream stays valid for every SSE parser)."""
    x.usage = tap.usage
    costs = price(x, tokens_of(x.usage), time.perf_counter() - x.started, metrics)
    said = {"cost_usd": costs.cost, "cost_error_usd": costs.cost_error,
            "curve_source": costs.source}  # fmt: skip
    return COST_COMMENT + orjson.dumps(said) + b"\n\n"
