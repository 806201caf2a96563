"""What a relayed request's span says of it when it ends: GenAI attribute names where they
fit (`gen_ai.*`), draftgate's else."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from gateway.relay.exchange import Exchange
from gateway.usage import tokens_of

if TYPE_CHECKING:
    from gateway.events.tracing import Tracing

logger = logging.getLogger(__name__)


def end_span(x: Exchange, tracing: Tracing) -> None:
    """End a request's span with what it did; a failure here never reaches the client."""
    try:
        attributes = request_attributes(x)
        tracing.end_request(x.span, attributes, x.status, x.outcome)
    except Exception:  # the top of the relay: a span must not drop the connection
        logger.exception("ending the span of request %s failed", x.request_id)


def request_attributes(x: Exchange) -> dict[str, str | int | float | bool]:
    """A relayed request's span attributes: GenAI names where they fit, draftgate's else."""
    found: dict[str, str | int | float | bool] = {
        "draftgate.request_id": x.request_id,
        "draftgate.outcome": x.outcome,
        "draftgate.attempts": x.attempts,
    }
    if x.request_class is not None:
        found["draftgate.request_class"] = x.request_class
    if x.status:
        found["http.response.status_code"] = x.status
    if x.model is not None:
        found["gen_ai.request.model"] = x.model[:200]
    if x.backend is not None:
        found["draftgate.backend"] = x.backend.name
        found["draftgate.method"] = x.backend.method
        if x.backend.k is not None:
            found["draftgate.k"] = x.backend.k
    if x.usage is not None:
        tokens = tokens_of(x.usage)
        found["gen_ai.usage.input_tokens"] = tokens.prompt
        found["gen_ai.usage.output_tokens"] = tokens.completion
        found["draftgate.tokens_estimated"] = x.tokens_estimated
    return found | _routing_attributes(x)


def _routing_attributes(x: Exchange) -> dict[str, str | int | float | bool]:
    found: dict[str, str | int | float | bool] = {}
    if x.first_byte is not None and x.chunks:  # a stream's first chunk, as the metric's TTFT
        found["draftgate.ttft_ms"] = round((x.first_byte - x.started) * 1000, 3)
    if x.fallback is not None:
        found["draftgate.fallback"] = x.fallback
    if x.rule is not None:
        found["draftgate.rule"] = x.rule.index
    if x.affinity_outcome is not None:
        found["draftgate.affinity"] = x.affinity_outcome
    if x.concurrency is not None:
        found["draftgate.backend_load"] = x.concurrency
    if x.costs is not None and x.costs.cost is not None:
        found["draftgate.cost_usd"] = x.costs.cost
    return found
