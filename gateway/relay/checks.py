"""What the relay refuses in a request before routing (its host, type, size, body and class),
and the usage options it adds."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.apikeys import hash_key
from gateway.errors import (
    BodyTooLarge,
    HostNotAllowed,
    InvalidApiKey,
    InvalidRequest,
    ModelNotAllowed,
    UnsupportedMediaType,
)
from gateway.registry import KeyView, Snapshot
from gateway.relay.asgi import ClientGone, Receive
from gateway.schemas.resources import nested_deeper

COMPLETION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})
GENERATION_PATHS = COMPLETION_PATHS | {"/v1/responses", "/v1/messages"}
BYTES_PER_TOKEN = 4  # a prompt's token estimate from its body's size (JSON framing included)
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # vLLM's (and OpenAI's) default for /v1/completions
# `x-draftgate-include-cost: true`: a stream ends with a comment holding its cost (its headers
# went out before its usage was known, so they cannot say it as a whole response's do).
INCLUDE_COST_HEADER = b"x-draftgate-include-cost"
# `true`: keep the engine's per-request speculative decoding block in the answer
INCLUDE_SPECULATION_HEADER = b"x-draftgate-include-speculation"
# vLLM's own bounds (SamplingParams): a value outside is refused here, before any backend.
SAMPLING_RANGES = {
    "temperature": (0.0, float("inf")),
    "top_p": (0.0, 1.0),
    "presence_penalty": (-2.0, 2.0),
    "frequency_penalty": (-2.0, 2.0),
}


def keyless_door(headers: dict[bytes, bytes], hosts: frozenset[bytes]) -> None:
    """Without API keys: the request must name a listed host and declare a JSON body (a page
    on another site can send neither: a form posts no JSON type, a rebound name its own host)."""
    if host_name(headers.get(b"host", b"")) not in hosts:
        raise HostNotAllowed(
            "Host not allowed: without API keys the gateway answers only the hosts in "
            "DRAFTGATE_KEYLESS_ALLOWED_HOSTS"
        )
    if b"content-type" not in headers:
        raise UnsupportedMediaType(
            "Content-Type must be application/json (required when API keys are not)"
        )


def host_name(host: bytes) -> bytes:
    """The name in a Host header, lower-case, without its port: `[::1]:8080` is `::1`."""
    if host.startswith(b"["):
        return host[1 : host.find(b"]")].lower()
    return host.partition(b":")[0].lower()


async def read_body(headers: dict[bytes, bytes], receive: Receive, limit: int) -> bytes:
    """The whole body of a JSON request, refused past `limit` bytes."""
    content_type = headers.get(b"content-type", b"application/json")  # as vLLM reads it
    if not content_type.split(b";")[0].strip().lower().endswith(b"json"):
        raise UnsupportedMediaType("Content-Type must be application/json")
    chunks: list[bytes] = []
    size = 0
    declared = headers.get(b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"Request body larger than {limit} bytes")
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"Request body larger than {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


def request_class(header: bytes | None, key: KeyView | None, classes: tuple[str, ...]) -> str:
    """The class the admin gave the key (its header cannot move a `batch` key out from under
    a `class:batch` rule), else the header's, else the default; an unknown one is a 400."""
    if key is not None and key.request_class:
        return key.request_class
    if header is None:
        return classes[0]
    name = header.decode("latin-1").strip().lower()
    if name not in classes:
        known = ", ".join(classes)
        raise InvalidRequest(
            f"Unknown request class {name[:40]!r} in x-draftgate-class; known: {known}",
            param="x-draftgate-class",
            code="unknown_request_class",
        )
    return name


class RefusalHold:
    """Holds the answer to a caller refused for its key a moment before it is sent. A client
    retrying a wrong or revoked key in a loop (or a flood of keyless bodies) waits for each
    answer, so it then costs the gateway a connection per `seconds`, not hundreds a second.
    A held caller holds a socket and a sleeping task, no worker and none of its body; at most
    `most` are held at once and the rest are answered at once, so the held stay bounded.
    Each hold is drawn from `seconds` to 1.5x that: callers refused together (a flood's
    clients) are answered apart, so their reconnections do not come back as one burst."""

    def __init__(self, seconds: float, most: int = 256, rng: random.Random | None = None) -> None:
        self.seconds, self.most, self.held = seconds, most, 0
        self.rng = rng or random.Random()  # noqa: S311  (spreading waits, not secrets)

    def draw(self) -> float:
        """One caller's hold, in seconds."""
        return self.seconds * (1 + self.rng.random() / 2)

    async def __call__(self) -> None:
        if self.seconds <= 0 or self.held >= self.most:
            return
        self.held += 1
        try:
            await asyncio.sleep(self.draw())
        finally:
            self.held -= 1


def bearer_token(headers: dict[bytes, bytes]) -> str:
    """The secret of a request's `Authorization: Bearer` header ("" without one)."""
    scheme, _, secret = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
    return secret.strip() if scheme.lower() == "bearer" else ""


def authenticate(headers: dict[bytes, bytes], snapshot: Snapshot, required: bool) -> KeyView | None:
    """The caller's key from its `Authorization` header (None when keys are not `required`
    and it has none), refused before anything else of the request is read."""
    secret = bearer_token(headers)
    key = snapshot.keys.get(hash_key(secret)) if secret else None
    if key is None and required:
        raise InvalidApiKey("Incorrect API key provided")
    return key


def has_key(headers: dict[bytes, bytes], snapshot: Snapshot) -> bool:
    """Whether the caller's `Authorization` header carries a key of the snapshot's."""
    return authenticate(headers, snapshot, required=False) is not None


def body_bound(key: KeyView | None, gateway_bound: int) -> int:
    """The largest body this caller may send: the key's own bound, never above the gateway's."""
    if key is None or key.max_body_bytes is None:
        return gateway_bound
    return min(key.max_body_bytes, gateway_bound)


def may_use(key: KeyView | None, model: str) -> None:
    """Refuse a key limited to other models."""
    if key is not None and key.allowed_models is not None and model not in key.allowed_models:
        who = f"Team `{key.name}`" if key.team_caller else "This key"
        raise ModelNotAllowed(f"{who} may not use model `{model}`")


def parse_body(body: bytes, max_depth: int) -> dict[str, Any]:
    """The JSON object of a request, nested at most `max_depth` deep (a deeper one can
    fail the backend's parser, or ours when it is written back out: a 400 here instead)."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"We could not parse the JSON body of your request: {exc}") from None
    if not isinstance(payload, dict):
        raise InvalidRequest("The request body must be a JSON object")
    if body.count(b"{") + body.count(b"[") > max_depth and nested_deeper(payload, max_depth):
        raise InvalidRequest(f"The request body is nested more than {max_depth} levels deep")
    return payload


def check_completion(path: str, payload: dict[str, Any]) -> None:
    """Refuse what no backend could accept, before it reaches one."""
    for name in ("max_tokens", "max_completion_tokens", "n"):
        value = payload.get(name)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise InvalidRequest(f"{name} must be a positive integer, got {value!r}", param=name)
    for name, (low, high) in SAMPLING_RANGES.items():
        value = payload.get(name)
        if value is not None and (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not low <= value <= high
        ):
            message = f"{name} must be a number from {low} to {high}, got {value!r}"
            raise InvalidRequest(message, param=name)
    if "stream" in payload and not isinstance(payload["stream"], bool | None):
        raise InvalidRequest(f"stream must be a boolean, got {payload['stream']!r}", param="stream")
    if path.endswith("chat/completions"):
        messages = payload.get("messages")
        if not isinstance(messages, list) or not messages:
            raise InvalidRequest("messages must be a non-empty list", param="messages")
    elif payload.get("prompt") is None:
        raise InvalidRequest("you must provide a prompt", param="prompt")


@dataclass(frozen=True, slots=True)
class UsageAsked:
    """The usage a client asked of a stream; what the gateway added beyond it is cut out."""

    final: bool  # include_usage: the closing usage-only chunk
    every_chunk: bool  # continuous_usage_stats: cumulative usage on each content chunk
    cost: bool = False  # INCLUDE_COST_HEADER: an SSE comment with its cost, last but [DONE]
    # INCLUDE_SPECULATION_HEADER: the engine's per-request speculative decoding block (whole
    # answers and streams alike)
    speculation: bool = False


def usage_asked(
    path: str, payload: dict[str, Any], cost_header: bytes = b"", speculation_header: bytes = b""
) -> UsageAsked:
    """What usage the client asked for (other streams than completions get all they send),
    whether its cost (`cost_header`: the value of INCLUDE_COST_HEADER, if sent) and its
    speculative decoding (`speculation_header`: INCLUDE_SPECULATION_HEADER's)."""
    cost = cost_header.strip().lower() == b"true"
    speculation = speculation_header.strip().lower() == b"true"
    if path not in COMPLETION_PATHS:
        return UsageAsked(final=True, every_chunk=True, cost=cost, speculation=speculation)
    options = payload.get("stream_options")
    options = options if isinstance(options, dict) else {}
    return UsageAsked(
        final=options.get("include_usage") is True,
        every_chunk=options.get("continuous_usage_stats") is True,
        cost=cost,
        speculation=speculation,
    )


def with_usage_options(payload: dict[str, Any]) -> bytes:
    """The body with include_usage and continuous usage asked of the backend."""
    options = payload.get("stream_options")
    options = dict(options) if isinstance(options, dict) else {}
    options["include_usage"] = True
    options["continuous_usage_stats"] = True
    return orjson.dumps({**payload, "stream_options": options})


def with_priority(body: bytes, priority: int) -> bytes:
    """The JSON object `body` with vLLM's `priority` set last, so it wins over a `priority`
    the client sent (a JSON object's last duplicate key is the one parsed)."""
    return b'%s,"priority":%d}' % (body.rstrip()[:-1], priority)


def worst_case_tokens(path: str, payload: dict[str, Any], body_bytes: int, limit: int) -> int:
    """The most tokens a request can use: its prompts' estimate plus every completion token it
    may ask for. What it is reserved against a key's limits."""
    prompt = prompt_estimate(path, payload, body_bytes, limit)
    return prompt + completion_worst_case(path, payload, limit)


def prompt_estimate(path: str, payload: dict[str, Any], body_bytes: int, limit: int) -> int:
    """A request's prompt tokens, estimated from its body's size (or counted, for prompts of
    token ids, whose digits can be fewer than 4 bytes a token), each prompt at most `limit`."""
    found = max(body_bytes // BYTES_PER_TOKEN, _token_ids(path, payload))
    return min(found, limit * prompt_count(path, payload))


def completion_worst_case(path: str, payload: dict[str, Any], limit: int) -> int:
    """Every completion token a request may ask for: max tokens (or the model's limit `limit`
    when it sets none, each at most `limit`) for each sequence it generates."""
    if path not in GENERATION_PATHS:  # embeddings, pooling, scoring: prompt only
        return 0
    default = COMPLETIONS_DEFAULT_MAX_TOKENS if path == "/v1/completions" else limit
    names = ("max_completion_tokens", "max_tokens", "max_output_tokens")
    asked = next((n for name in names if (n := _positive_int(payload.get(name)))), default)
    return min(asked, limit) * sequences(path, payload)


def sequences(path: str, payload: dict[str, Any]) -> int:
    """The sequences a backend generates for a request: `n` (or `best_of` where larger: vLLM
    generates that many and returns the best `n`) for each of its prompts."""
    n = _positive_int(payload.get("n")) or 1
    best_of = _positive_int(payload.get("best_of")) or 1
    return prompt_count(path, payload) * max(n, best_of)


def prompt_count(path: str, payload: dict[str, Any]) -> int:
    """The prompts of a request: a `/v1/completions` list of texts or of token-id lists is a
    completion per prompt (as vLLM serves it); anything else is one."""
    prompt = payload.get("prompt") if path == "/v1/completions" else None
    if isinstance(prompt, list) and prompt and all(isinstance(p, str | list) for p in prompt):
        return len(prompt)
    return 1


def _token_ids(path: str, payload: dict[str, Any]) -> int:
    """The token ids a `/v1/completions` prompt is made of (0 for text)."""
    prompt = payload.get("prompt") if path == "/v1/completions" else None
    if not isinstance(prompt, list):
        return 0
    return sum(len(p) if isinstance(p, list) else isinstance(p, int) for p in prompt)


def _positive_int(value: Any) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
    return value if ok else None
