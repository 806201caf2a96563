"""What the relay refuses before routing: the OpenAI error it answers with, and body checks."""

from __future__ import annotations

from typing import Any

import orjson

COMPLETION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})
# vLLM's own bounds (SamplingParams): a value outside is refused here, before any backend.
SAMPLING_RANGES = {
    "temperature": (0.0, float("inf")),
    "top_p": (0.0, 1.0),
    "presence_penalty": (-2.0, 2.0),
    "frequency_penalty": (-2.0, 2.0),
}


class RelayError(Exception):
    """An error answered with the OpenAI envelope."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        error_type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        retry_after_s: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.error_type = status, message, error_type
        self.code, self.param, self.retry_after_s = code, param, retry_after_s


def parse_body(body: bytes) -> dict[str, Any]:
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise RelayError(400, f"We could not parse the JSON body of your request: {exc}") from None
    if not isinstance(payload, dict):
        raise RelayError(400, "The request body must be a JSON object")
    return payload


def check_completion(path: str, payload: dict[str, Any]) -> None:
    """Refuse what no backend could accept, before it reaches one."""
    for name in ("max_tokens", "max_completion_tokens", "n"):
        value = payload.get(name)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise RelayError(400, f"{name} must be a positive integer, got {value!r}", param=name)
    for name, (low, high) in SAMPLING_RANGES.items():
        value = payload.get(name)
        if value is not None and (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not low <= value <= high
        ):
            message = f"{name} must be a number from {low} to {high}, got {value!r}"
            raise RelayError(400, message, param=name)
    if "stream" in payload and not isinstance(payload["stream"], bool | None):
        raise RelayError(
            400, f"stream must be a boolean, got {payload['stream']!r}", param="stream"
        )
    if path.endswith("chat/completions"):
        messages = payload.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RelayError(400, "messages must be a non-empty list", param="messages")
    elif payload.get("prompt") is None:
        raise RelayError(400, "you must provide a prompt", param="prompt")


def wants_usage(payload: dict[str, Any]) -> bool:
    options = payload.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def with_usage_options(payload: dict[str, Any]) -> bytes:
    """The body with include_usage and continuous usage asked of the backend."""
    options = payload.get("stream_options")
    options = dict(options) if isinstance(options, dict) else {}
    options["include_usage"] = True
    options["continuous_usage_stats"] = True
    return orjson.dumps({**payload, "stream_options": options})
