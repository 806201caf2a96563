"""Token counts out of a backend's `usage` object, whatever the endpoint (pure).

Chat and text completions and embeddings report `prompt_tokens` and `completion_tokens`;
the Responses API and Anthropic-style messages report `input_tokens` and `output_tokens`.
A count that is not a whole number in [0, MAX_TOKENS] is set aside (counted as 0 and named
in `rejected`), so one bad value from a backend can never stop the ledger or lose the record.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

MAX_TOKENS = 10**9  # far above any context window; the ledger's columns hold it
PROMPT_KEYS = ("prompt_tokens", "input_tokens")
COMPLETION_KEYS = ("completion_tokens", "output_tokens")
# Anthropic-style usage counts prompt tokens read from or written to the prefix cache apart
# from `input_tokens` (vLLM: input = prompt - cache_read - cache_creation): all are prompt.
CACHED_PROMPT_KEYS = (("cache_read_input_tokens",), ("cache_creation_input_tokens",))


@dataclass(frozen=True, slots=True)
class Tokens:
    """A request's token counts, and the usage fields that could not be counted."""

    prompt: int = 0
    completion: int = 0
    rejected: tuple[str, ...] = ()


def tokens_of(usage: dict[str, Any] | None) -> Tokens:
    """The prompt and completion counts of a usage object (0 where it has none)."""
    if not usage:
        return Tokens()
    rejected: list[str] = []
    prompt = _count(usage, PROMPT_KEYS, rejected)
    if "input_tokens" in usage:
        prompt += sum(_count(usage, keys, rejected) for keys in CACHED_PROMPT_KEYS)
    completion = _count(usage, COMPLETION_KEYS, rejected)
    return Tokens(prompt, completion, tuple(rejected))


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
