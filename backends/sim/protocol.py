"""vLLM's OpenAI-compatible request parsing, usage objects and error shapes, as bytes (the
response bodies: `writers.py`)."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, replace
from typing import Any, TypeGuard

from backends.sim.text import (
    CHAT_PROMPT_TOKENS,
    CHAT_TEMPLATE_TOKENS,
    count_tokens,
    prompt_words,
    template_words,
)

_json = functools.partial(json.dumps, separators=(",", ":"))

# Characters per token we are prepared to tokenize; beyond this a prompt is refused unread.
MAX_CHARS_PER_TOKEN = 16


class ApiError(Exception):
    """An error in vLLM's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(
        self, status: int, message: str, param: str | None = None, kind: str | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind

    @property
    def error_type(self) -> str:
        """vLLM's type: its Responses API store names its own (`invalid_request_error`)."""
        return self.kind or {400: "BadRequestError", 404: "NotFoundError"}.get(
            self.status, "InternalServerError"
        )

    def body(self) -> bytes:
        """The JSON error body."""
        error = {
            "message": self.message,
            "type": self.error_type,
            "param": self.param,
            "code": self.status,
        }
        return _json({"error": error}).encode()


@dataclass(frozen=True)
class Generation:
    """A parsed completion request."""

    chat: bool
    model: str
    prompt_text: str
    prompt_tokens: int
    max_tokens: int
    stream: bool
    include_usage: bool
    continuous_usage: bool
    ignore_eos: bool
    workload: str | None
    responses: bool = False  # the Responses API: named events, input/output token usage
    messages: bool = False  # Anthropic-style /v1/messages: named events, input/output usage
    parts: tuple[tuple[str, str], ...] = ()  # a chat prompt's (role, content) per message
    # A completions list of several prompts, each (text, tokens): a completion per prompt,
    # as vLLM serves it (then `prompt_text` and `prompt_tokens` are their whole).
    prompts: tuple[tuple[str, int], ...] = ()
    store: bool = False  # the Responses API's `store` (kept only where the server stores)
    token_ids: bool = False  # vLLM's `return_token_ids`: each choice's ids, and the prompt's
    priority: int = 0  # vLLM's `priority`: lower first, where the server schedules by it

    def prompt_words(self) -> list[str]:
        """The prompt as the engine sees it, one string per token: a chat prompt's
        messages each behind their template tokens, then the assistant prefix."""
        return template_words(self.parts) if self.chat else prompt_words(self.prompt_text)


def parse_body(raw: bytes) -> dict[str, Any]:
    """The request's JSON object, or a 400."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"Invalid JSON in request body: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "Request body must be a JSON object")
    return body


def _check_model(body: dict[str, Any], served_model: str) -> None:
    """404 for any model but the one served, as vLLM answers."""
    model = body.get("model")
    if model != served_model:
        raise ApiError(
            404, f"The model `{model}` does not exist. Valid aliases: {served_model}.", "model"
        )


def parse_generation(
    body: dict[str, Any], *, chat: bool, served_model: str, max_model_len: int
) -> Generation:
    """Validate a chat or text completion request the way vLLM does."""
    _check_model(body, served_model)
    parts = _messages(body.get("messages")) if chat else ()
    texts = (_joined(parts),) if chat else _prompt_texts(body.get("prompt"))
    longest = max(len(text) for text in texts)  # each prompt is checked, as vLLM does
    if longest > max_model_len * MAX_CHARS_PER_TOKEN:
        raise _too_long(max_model_len, longest // MAX_CHARS_PER_TOKEN, 0, chat)
    counts = [count_tokens(text) for text in texts]
    if chat:
        counts[0] += CHAT_TEMPLATE_TOKENS * len(parts) + CHAT_PROMPT_TOKENS
    max_tokens = _max_tokens(body, max_model_len - max(counts))
    if max(counts) + max_tokens > max_model_len:
        raise _too_long(max_model_len, max(counts), max_tokens, chat)
    if _integer(body, "n", 1) != 1:
        raise ApiError(400, "n must be 1 on this server", "n")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ApiError(400, "stream_options must be an object", "stream_options")
    stream = _flag(body, "stream")
    if options and not stream:
        raise ApiError(400, "Stream options can only be defined when `stream=True`.")
    return Generation(
        chat=chat,
        model=served_model,
        prompt_text="\n".join(texts),
        prompt_tokens=sum(counts),
        max_tokens=max_tokens,
        stream=stream,
        include_usage=_flag(options, "include_usage"),
        continuous_usage=_flag(options, "continuous_usage_stats"),
        ignore_eos=_flag(body, "ignore_eos"),
        workload=body.get("sim_workload") if isinstance(body.get("sim_workload"), str) else None,
        parts=parts,
        prompts=tuple(zip(texts, counts, strict=True)) if len(texts) > 1 else (),
        token_ids=_flag(body, "return_token_ids"),
        priority=_integer(body, "priority", 0),
    )


def parse_responses(body: dict[str, Any], *, served_model: str, max_model_len: int) -> Generation:
    """Validate a Responses API request (`input`, `instructions`, `max_output_tokens`)."""
    _check_model(body, served_model)
    given = body.get("input")
    messages = [{"role": "user", "content": given}] if isinstance(given, str) else given
    if isinstance(body.get("instructions"), str):
        messages = [{"role": "system", "content": body["instructions"]}, *(messages or [])]
    parts = _messages(messages)
    text = _joined(parts)
    if len(text) > max_model_len * MAX_CHARS_PER_TOKEN:
        raise _too_long(max_model_len, len(text) // MAX_CHARS_PER_TOKEN, 0, True)
    prompt_tokens = count_tokens(text) + CHAT_TEMPLATE_TOKENS * len(parts) + CHAT_PROMPT_TOKENS
    room = max_model_len - prompt_tokens
    max_tokens = _integer(body, "max_output_tokens", room)
    if max_tokens < 1 or prompt_tokens + max_tokens > max_model_len:
        raise _too_long(max_model_len, prompt_tokens, max_tokens, True)
    generation = _named_events(body, served_model, parts, prompt_tokens, max_tokens, responses=True)
    return replace(generation, store=body.get("store") is not False)


def parse_messages(body: dict[str, Any], *, served_model: str, max_model_len: int) -> Generation:
    """Validate an Anthropic-style `/v1/messages` request (`messages`, `system`, and the
    required `max_tokens`), as vLLM 0.32's `AnthropicMessagesRequest` takes it."""
    _check_model(body, served_model)
    messages = body.get("messages")
    system = body.get("system")
    if isinstance(system, list):
        system = " ".join(str(b.get("text", "")) for b in system if isinstance(b, dict))
    if isinstance(system, str) and isinstance(messages, list):
        messages = [{"role": "system", "content": system}, *messages]
    parts = _messages(messages)
    prompt_tokens = count_tokens(_joined(parts)) + CHAT_TEMPLATE_TOKENS * len(parts)
    prompt_tokens += CHAT_PROMPT_TOKENS
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
        raise ApiError(400, "max_tokens: Field required (an integer)", "max_tokens")
    if max_tokens < 1 or prompt_tokens + max_tokens > max_model_len:
        raise _too_long(max_model_len, prompt_tokens, max_tokens, True)
    return _named_events(body, served_model, parts, prompt_tokens, max_tokens, messages=True)


def _named_events(
    body: dict[str, Any],
    served_model: str,
    parts: tuple[tuple[str, str], ...],
    prompt_tokens: int,
    max_tokens: int,
    *,
    responses: bool = False,
    messages: bool = False,
) -> Generation:
    """A chat generation of an API with named events and usage always sent (the Responses
    API or messages)."""
    return Generation(
        chat=True,
        model=served_model,
        prompt_text=_joined(parts),
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        stream=_flag(body, "stream"),
        include_usage=True,
        continuous_usage=False,
        ignore_eos=_flag(body, "ignore_eos"),
        workload=body.get("sim_workload") if isinstance(body.get("sim_workload"), str) else None,
        parts=parts,
        responses=responses,
        messages=messages,
    )


def _messages(messages: object) -> tuple[tuple[str, str], ...]:
    """Each message's (role, content as text), or a 400."""
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list", "messages")
    parts = []
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ApiError(400, "each message needs a string role", "messages")
        content = message.get("content")
        if isinstance(content, list):
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        if content is not None and not isinstance(content, str):
            raise ApiError(400, "message content must be a string or a list of parts", "messages")
        parts.append((message["role"], content or ""))
    return tuple(parts)


def _joined(parts: tuple[tuple[str, str], ...]) -> str:
    """The messages' contents, one per line: the text that seeds the reply."""
    return "\n".join(content for _, content in parts)


def _prompt_texts(prompt: object) -> tuple[str, ...]:
    """A completions prompt as vLLM takes it: a text, token ids, or a list of texts or of
    token-id lists (a completion each)."""
    if isinstance(prompt, str):
        return (prompt,)
    if _token_ids(prompt):
        return (_ids_text(prompt),)
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return tuple(prompt)
        if all(_token_ids(p) for p in prompt):
            return tuple(_ids_text(p) for p in prompt)
    raise ApiError(400, "prompt must be a string, token ids, or a list of either", "prompt")


def _token_ids(prompt: object) -> TypeGuard[list[int]]:
    if not isinstance(prompt, list) or not prompt:
        return False
    return all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)


def _ids_text(ids: list[int]) -> str:
    return " ".join(f"t{t}" for t in ids)  # one token per id


def _max_tokens(body: dict[str, Any], room: int) -> int:
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    value = body.get(key)
    if value is None:
        return max(room, 1)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"{key} must be an integer, got {value!r}", key)
    if value < 1:
        raise ApiError(400, f"{key} must be at least 1, got {value}.", key)
    return value


def _integer(body: dict[str, Any], key: str, default: int) -> int:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"{key} must be an integer, got {value!r}", key)
    return value


def _flag(body: dict[str, Any], key: str) -> bool:
    value = body.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ApiError(400, f"{key} must be a boolean, got {value!r}", key)
    return value


def _too_long(limit: int, prompt: int, completion: int, chat: bool) -> ApiError:
    where = "messages" if chat else "prompt"
    return ApiError(
        400,
        f"This model's maximum context length is {limit} tokens. However, you requested "
        f"{prompt + completion} tokens ({prompt} in the {where}, {completion} in the "
        f"completion). Please reduce the length of the {where} or completion.",
    )


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """OpenAI usage object, as vLLM puts it on stream chunks."""
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }


def full_usage(
    prompt_tokens: int, completion_tokens: int, details: dict[str, int] | None = None
) -> dict[str, Any]:
    """Usage of a whole (non-streamed) response, with vLLM's token details (null unless
    `details`: the prompt's, `{"cached_tokens": n}`)."""
    empty = {"prompt_tokens_details": details, "completion_tokens_details": None}
    return {**usage(prompt_tokens, completion_tokens), **empty}


def prompt_details(chat: bool, cached_tokens: int | None) -> dict[str, int] | None:
    """vLLM's `prompt_tokens_details` under --enable-prompt-tokens-details (`cached_tokens`
    None: without it): a chat says the cached tokens only when some were, a text completion
    always."""
    if cached_tokens is None or (chat and not cached_tokens):
        return None
    return {"cached_tokens": cached_tokens}
