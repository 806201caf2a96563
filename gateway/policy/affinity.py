"""Cache affinity: which backend of a pool already holds a request's prefix, pure.

A request's session key comes from, in order: the affinity header (`x-session-id` by
default) a client sets; else the OpenAI `user` field; else a hash of the conversation's
opening — the messages up to and including the first user message (the prompt, for text
completions), each cut to `affinity_prefix_chars`. The opening is what every later turn of
a conversation repeats verbatim, so all its turns share one key; two conversations behind
the same system prompt differ in their first user message, so they spread over the pool
while each backend caches the shared system prompt once. The last turn's text is never
part of the key: it changes every turn.

Backends are ranked for a key by rendezvous hashing (highest random weight): each backend
scores `mix(key ^ seed(backend))`, so a backend joining or leaving moves only the keys it
wins or held, and keys spread evenly. The load bound (consistent hashing with bounded
loads): a backend whose load is at or past `ceil((1 + balance) * (Σ load + 1) / n)` is
passed over for the key's next choice, so no backend takes more than its share plus
`balance`; the load is the routing load, in flight here plus the scraped queue and KV cache.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

Source = Literal["header", "user", "prefix"]
MASK = (1 << 64) - 1
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Affinity:
    """A request's session key and the load bound's slack (`affinity_balance`); `held`: a
    session its backend's cache holds (named by a header or `user`, or a later turn of a
    conversation), which a burst spill never moves."""

    key: int
    balance: float
    held: bool = False


def stable_hash(data: bytes) -> int:
    """A 64-bit hash every gateway replica and worker agrees on (`hash` is salted)."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def session_key(
    header_value: bytes, payload: Mapping[str, Any], prefix_chars: int
) -> tuple[int, Source] | None:
    """The request's session key and where it came from; None when it has none."""
    if header_value:
        return stable_hash(header_value), "header"
    user = payload.get("user")
    if isinstance(user, str) and user:
        return stable_hash(user.encode()), "user"
    if prefix_chars <= 0:
        return None
    opening = _opening(payload, prefix_chars)
    return (stable_hash(opening.encode()), "prefix") if opening else None


def _opening(payload: Mapping[str, Any], chars: int) -> str:
    """The conversation's opening messages, each cut to `chars`; or the prompt's start."""
    messages = payload.get("messages")
    if not isinstance(messages, list):
        messages = payload.get("input")  # the Responses API's list of items
    if isinstance(messages, list):
        parts = []
        for message in messages:
            if not isinstance(message, dict):
                break
            content = message.get("content")
            if isinstance(content, list):  # parts: the first text part stands for them
                content = next((p.get("text") for p in content if isinstance(p, dict)), None)
            role = message.get("role")
            parts.append(f"{role}\x1f{content if isinstance(content, str) else ''}"[:chars])
            if role == "user":
                break
        return "\x1e".join(parts)
    prompt = payload.get("prompt", payload.get("input"))
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, list):  # token ids
        return ",".join(str(t) for t in prompt[:chars])
    return prompt[:chars] if isinstance(prompt, str) else ""


def later_turn(payload: Mapping[str, Any]) -> bool:
    """Whether the request continues a conversation: an assistant turn among its messages
    (or the Responses API's input items), whose prefix a backend's cache holds."""
    messages = payload.get("messages", payload.get("input"))
    if not isinstance(messages, list):
        return False
    return any(isinstance(m, dict) and m.get("role") == "assistant" for m in messages)


def mix(x: int) -> int:
    """splitmix64's finaliser: a well-spread 64-bit score from a 64-bit input."""
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def load_bound(loads: Sequence[float], balance: float) -> float:
    """A backend at or past this load takes no more keys that prefer it."""
    return math.ceil((1 + balance) * (sum(loads) + 1) / len(loads))


def by_affinity(
    items: Sequence[T],
    key: int,
    seed: Callable[[T], int],
    load: Callable[[T], float],
    balance: float,
) -> tuple[list[T], bool]:
    """`items` in the key's order of preference, the first one under the load bound moved
    to the front; and whether that is the key's own first choice (False: it spilled)."""
    if len(items) == 1:  # a pool of one (common: a backend per method) is always the home
        return list(items), True
    ranked = sorted(items, key=lambda item: mix(key ^ seed(item)), reverse=True)
    loads = [load(item) for item in ranked]
    bound = load_bound(loads, balance)
    for i, value in enumerate(loads):
        if value < bound:
            return ([ranked[i], *ranked[:i], *ranked[i + 1 :]] if i else ranked), i == 0
    return ranked, True  # unreachable: the lightest backend is always under the bound
