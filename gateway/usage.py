"""Token counts out of a backend's `usage` object, whatever the endpoint (pure).

Chat and text completions and embeddings report `prompt_tokens` and `completion_tokens`;
the Responses API and Anthropic-style messages report `input_tokens` and `output_tokens`.
A count that is not a whole number in [0, MAX_TOKENS] is set aside (counted as 0 and named
in `rejected`), so one bad value from a backend can never stop the ledger or lose the record.

The prompt tokens read from the backend's prefix cache (their prefill skipped) are counted
apart where the usage says them: `prompt_tokens_details.cached_tokens` (vLLM, with
`--enable-prompt-tokens-details`, on a whole response and on a stream's usage-only chunk),
`input_tokens_details.cached_tokens` (the Responses API), `cache_read_input_tokens`
(Anthropic-style). More cached tokens than the prompt has is set aside like a bad count.

A request's own speculative decoding is read where the engine reports it: vLLM's
`--per-request-spec-decode-metrics` block (`metrics.speculative_decoding`, on a whole
response and on a stream's usage-only chunk): its verify steps, draft tokens proposed and
accepted. A block whose counts do not hold together is ignored, never half-read. The gateway
asks for the block for its own ledger, so it cuts it out of the answer unless the client
asked for it too (`cut_speculation`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, TypeGuard

import orjson

MAX_TOKENS = 10**9  # far above any context window; the ledger's columns hold it
PROMPT_KEYS = ("prompt_tokens", "input_tokens")
RESPONSE_ID_CHARS = 128  # usage_records.response_id
COMPLETION_KEYS = ("completion_tokens", "output_tokens")
# Anthropic-style usage counts prompt tokens read from or written to the prefix cache apart
# from `input_tokens` (vLLM: input = prompt - cache_read - cache_creation): all are prompt.
CACHE_READ = "cache_read_input_tokens"
CACHED_PROMPT_KEYS = ((CACHE_READ,), ("cache_creation_input_tokens",))
CACHED_DETAILS = ("prompt_tokens_details", "input_tokens_details")  # each with cached_tokens
SPECULATION = "speculative_decoding"  # in a response's `metrics`


@dataclass(frozen=True, slots=True)
class Tokens:
    """A request's token counts, and the usage fields that could not be counted; `cached`
    of the prompt tokens came from the prefix cache (None: the backend did not say)."""

    prompt: int = 0
    completion: int = 0
    rejected: tuple[str, ...] = ()
    cached: int | None = None


def tokens_of(usage: dict[str, Any] | None) -> Tokens:
    """The prompt, completion and cached prompt counts of a usage object (0 where it has
    none; cached None)."""
    if not usage:
        return Tokens()
    rejected: list[str] = []
    prompt = _count(usage, PROMPT_KEYS, rejected)
    cached = None
    if "input_tokens" in usage:
        read, created = (_count(usage, keys, rejected) for keys in CACHED_PROMPT_KEYS)
        prompt += read + created
        if usage.get(CACHE_READ) is not None and CACHE_READ not in rejected:
            cached = read
    completion = _count(usage, COMPLETION_KEYS, rejected)
    if cached is None:
        cached = _cached(usage, prompt, rejected)
    return Tokens(prompt, completion, tuple(rejected), cached)


def _cached(usage: dict[str, Any], prompt: int, rejected: list[str]) -> int | None:
    """The `cached_tokens` of the usage's details object, if it has one: a whole number no
    larger than the prompt, else set aside and named (None)."""
    for holder in CACHED_DETAILS:
        details = usage.get(holder)
        if details is None:
            continue
        name = f"{holder}.cached_tokens"
        if not isinstance(details, dict):
            rejected.append(name)
            return None
        if details.get("cached_tokens") is None:
            return None
        bad: list[str] = []
        cached = _count(details, ("cached_tokens",), bad)
        if bad or cached > prompt:
            rejected.append(name)
            return None
        return cached
    return None


def _count(usage: dict[str, Any], keys: tuple[str, ...], rejected: list[str]) -> int:
    for key in keys:
        if key not in usage or usage[key] is None:
            continue
        value = usage[key]
        if isinstance(value, bool) or not isinstance(value, int | float):
            rejected.append(key)
            return 0
        if not math.isfinite(value) or value < 0 or value > MAX_TOKENS or value != int(value):
            rejected.append(key)
            return 0
        return int(value)
    return 0


@dataclass(frozen=True, slots=True)
class Speculation:
    """One request's speculative decoding as its engine reported it: verify steps, draft
    tokens proposed, draft tokens accepted. Its acceptance length is 1 + accepted / steps."""

    steps: int
    drafted: int
    accepted: int


def json_body(content: bytes) -> dict[str, Any] | None:
    """A whole response's JSON object, if it is one."""
    try:
        body = orjson.loads(content)
    except orjson.JSONDecodeError:
        return None
    return body if isinstance(body, dict) else None


def usage_in(body: dict[str, Any] | None) -> dict[str, Any] | None:
    """The `usage` object of a whole response's body, if it has one."""
    usage = body.get("usage") if body is not None else None
    return usage if isinstance(usage, dict) else None


def speculation_in(body: dict[str, Any] | None) -> Speculation | None:
    """The request's speculative decoding from a body's `metrics.speculative_decoding`
    (at the top, or in a Responses API event's `response`), if it holds together."""
    if body is None:
        return None
    metrics = body.get("metrics")
    if metrics is None and isinstance(inner := body.get("response"), dict):
        metrics = inner.get("metrics")
    spec = metrics.get(SPECULATION) if isinstance(metrics, dict) else None
    if not isinstance(spec, dict):
        return None
    steps, drafted, accepted = (
        spec.get(k) for k in ("num_spec_steps", "num_draft_tokens", "num_accepted_draft_tokens")
    )
    if not (_whole(steps) and _whole(drafted) and _whole(accepted)):
        return None
    if accepted > drafted or drafted < steps:  # every step drafts at least one token
        return None
    return Speculation(steps, drafted, accepted)


def cut_speculation(body: dict[str, Any]) -> bool:
    """Take the speculative decoding block out of a body (at the top, or in a Responses API
    event's `response`), and its `metrics` with it when nothing else is left there; whether
    there was one."""
    holder = body
    if not isinstance(body.get("metrics"), dict) and isinstance(body.get("response"), dict):
        holder = body["response"]
    metrics = holder.get("metrics")
    if not isinstance(metrics, dict) or SPECULATION not in metrics:
        return False
    del metrics[SPECULATION]
    if not metrics:
        del holder["metrics"]
    return True


def _whole(n: object) -> TypeGuard[int]:
    return type(n) is int and 0 <= n <= MAX_TOKENS


def response_id_in(body: dict[str, Any] | None) -> str | None:
    """The `id` of a whole Responses API body (`"object": "response"`), if it has one."""
    if body is None or body.get("object") != "response":
        return None
    found = body.get("id")
    return found if isinstance(found, str) and len(found) <= RESPONSE_ID_CHARS else None
