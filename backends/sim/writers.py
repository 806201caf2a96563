"""vLLM's OpenAI-compatible response bodies and SSE events, as bytes: completions and chat,
the Responses API's named events and Anthropic-style messages (requests: `protocol.py`)."""

from __future__ import annotations

import functools
import json
import time
import uuid
from collections.abc import Callable
from typing import Any

from backends.sim.protocol import Generation, full_usage, prompt_details, usage
from backends.sim.text import ids_of, token_ids

_json = functools.partial(json.dumps, separators=(",", ":"))


# Keys vLLM 0.32 sends that the simulator has no values for (the tier against real vLLM
# checks every response shape, key for key).
SYSTEM_FINGERPRINT = "vllm-0.32.0-sim"
_CHAT_MESSAGE_EXTRAS = dict.fromkeys(["annotations", "audio", "function_call", "reasoning"])
_CHAT_CHOICE_EXTRAS = dict.fromkeys(["token_ids", "routed_experts"])
_COMPLETION_CHOICE_EXTRAS = dict.fromkeys(
    ["token_ids", "prompt_logprobs", "prompt_token_ids", "routed_experts"]
)
_CHAT_BODY_EXTRAS = dict.fromkeys(["prompt_logprobs", "prompt_token_ids", "prompt_text"])
_TRANSFER_EXTRAS = dict.fromkeys(["kv_transfer_params", "ec_transfer_params"])


class ResponseWriter:
    """Builds one completion's response bodies and SSE chunks, with its id and timestamp."""

    def __init__(self, generation: Generation) -> None:
        self.g = generation
        prefix = "chatcmpl" if generation.chat else "cmpl"
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        kind = "chat.completion.chunk" if generation.chat else "text_completion"
        self._head = (
            f'data: {{"id":"{self.id}","object":"{kind}","created":{self.created},'
            f'"model":{_json(generation.model)},"choices":['
        )

    def opening(self) -> bytes:
        """What a stream starts with: the role chunk of a chat, nothing for text."""
        return self.role_chunk() if self.g.chat else b""

    def closing(
        self,
        completion_tokens: int,
        metrics: dict[str, Any] | None,
        cached_tokens: int | None = None,
    ) -> bytes:
        """What a finished stream ends with: the usage chunk if asked for, then [DONE]."""
        usage = b""
        if self.g.include_usage:
            usage = self.usage_chunk(completion_tokens, metrics, cached_tokens)
        return usage + DONE

    def role_chunk(self) -> bytes:
        """The first chat chunk, announcing the assistant role."""
        delta = '{"role":"assistant","content":""}'
        choice = f'{{"index":0,"delta":{delta},"logprobs":null,"finish_reason":null}}'
        return self._chunk(choice, f',"prompt_token_ids":{self._prompt_ids()},"prompt_text":null')

    def text_chunk(
        self,
        text: str,
        finish_reason: str | None,
        completion_tokens: int,
        index: int = 0,
        prompt_tokens: int | None = None,
    ) -> bytes:
        """A chunk carrying new text (and the finish reason on the last one) for the choice
        `index`; continuous usage is that choice's own, with its prompt's tokens, as vLLM's."""
        finish = f'"finish_reason":{_json(finish_reason)}'
        if self.g.chat:
            stop = ',"stop_reason":null' if finish_reason is not None else ""
            choice = (
                f'{{"index":{index},"delta":{{"content":{_json(text)}}},"logprobs":null,'
                f'{finish}{stop},"token_ids":{self._ids(text)}}}'
            )
        else:
            choice = (
                f'{{"index":{index},"text":{_json(text)},"logprobs":null,{finish},'
                f'"stop_reason":null,"prompt_token_ids":null,"token_ids":{self._ids(text)}}}'
            )
        extra = ""
        if self.g.continuous_usage:
            prompt = self.g.prompt_tokens if prompt_tokens is None else prompt_tokens
            extra = f',"usage":{_json(usage(prompt, completion_tokens))}'
        return self._chunk(choice, extra)

    def _ids(self, text: str) -> str:
        """A chunk's `token_ids`: its text's, when the request asked for them."""
        return _json(token_ids(text)) if self.g.token_ids else "null"

    def _prompt_ids(self) -> str:
        """The `prompt_token_ids`, when the request asked for them."""
        return _json(ids_of(self.g.prompt_words())) if self.g.token_ids else "null"

    def usage_chunk(
        self,
        completion_tokens: int,
        metrics: dict[str, Any] | None,
        cached_tokens: int | None = None,
    ) -> bytes:
        """The final chunk with usage (its prompt's details when it has them, the only chunk
        that does) and per-request metrics when enabled."""
        counts: dict[str, Any] = usage(self.g.prompt_tokens, completion_tokens)
        details = prompt_details(self.g.chat, cached_tokens)
        if details is not None:
            counts["prompt_tokens_details"] = details
        extra = f',"usage":{_json(counts)}'
        extra += f',"system_fingerprint":"{SYSTEM_FINGERPRINT}"'
        if metrics is not None:
            extra += f',"metrics":{_json(metrics)}'
        return self._chunk("", extra)

    def _chunk(self, choices: str, extra: str = "") -> bytes:
        return f"{self._head}{choices}]{extra}}}\n\n".encode()

    def full_response(
        self,
        text: str,
        finish_reason: str,
        completion_tokens: int,
        metrics: dict[str, Any] | None,
        cached_tokens: int | None = None,
    ) -> bytes:
        """The non-streaming response body, with every key vLLM sends."""
        choices = [(text, finish_reason)]
        return self.full_choices(choices, completion_tokens, metrics, cached_tokens)

    def full_choices(
        self,
        choices: list[tuple[str, str]],
        completion_tokens: int,
        metrics: dict[str, Any] | None,
        cached_tokens: int | None = None,
    ) -> bytes:
        """The non-streaming response body of one or more (text, finish reason) choices."""
        body: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion" if self.g.chat else "text_completion",
            "created": self.created,
            "model": self.g.model,
            "choices": [self._choice(i, *choice) for i, choice in enumerate(choices)],
            "service_tier": None,
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "usage": full_usage(
                self.g.prompt_tokens,
                completion_tokens,
                prompt_details(self.g.chat, cached_tokens),
            ),
        }
        if self.g.chat:
            body |= _CHAT_BODY_EXTRAS
            if self.g.token_ids:
                body["prompt_token_ids"] = ids_of(self.g.prompt_words())
        return _json(body | _TRANSFER_EXTRAS | {"metrics": metrics}).encode()

    def _choice(self, index: int, text: str, finish_reason: str) -> dict[str, Any]:
        ending = {"logprobs": None, "finish_reason": finish_reason, "stop_reason": None}
        if self.g.chat:
            message = {"role": "assistant", "content": text, "refusal": None}
            choice = {"index": index, "message": message | _CHAT_MESSAGE_EXTRAS}
            return choice | ending | _CHAT_CHOICE_EXTRAS | self._choice_ids(text, False)
        choice = {"index": index, "text": text} | ending | _COMPLETION_CHOICE_EXTRAS
        return choice | self._choice_ids(text, True)

    def _choice_ids(self, text: str, prompt: bool) -> dict[str, Any]:
        """A whole choice's ids (and its prompt's, on a text completion), when asked."""
        if not self.g.token_ids:
            return {}
        ids: dict[str, Any] = {"token_ids": token_ids(text)}
        if prompt:
            ids["prompt_token_ids"] = ids_of(self.g.prompt_words())
        return ids


DONE = b"data: [DONE]\n\n"


class ResponsesWriter:
    """The Responses API's body and named SSE events for one request, as vLLM 0.32 sends
    them: `response.created` ... `response.output_text.delta` ... `response.completed`, whose
    response carries the usage (`input_tokens`, `output_tokens`)."""

    def __init__(self, generation: Generation) -> None:
        self.g = generation
        self.id = f"resp_{uuid.uuid4().hex}"
        self.item_id = f"msg_{uuid.uuid4().hex}"
        self.created = int(time.time())
        self._sequence = 0
        self._parts: list[str] = []
        self.keep: Callable[[str, dict[str, Any]], None] | None = None  # the server's store

    def opening(self) -> bytes:
        item = {"id": self.item_id, "type": "message", "role": "assistant",
                "status": "in_progress", "content": []}  # fmt: skip
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return b"".join([
            self._event("response.created", response=self._response("in_progress", None)),
            self._event("response.in_progress", response=self._response("in_progress", None)),
            self._event("response.output_item.added", output_index=0, item=item),
            self._event("response.content_part.added", item_id=self.item_id, output_index=0,
                        content_index=0, part=part),
        ])  # fmt: skip

    def text_chunk(self, text: str, finish_reason: str | None, completion_tokens: int) -> bytes:
        self._parts.append(text)
        return self._event("response.output_text.delta", item_id=self.item_id, output_index=0,
                           content_index=0, delta=text, logprobs=[])  # fmt: skip

    def closing(
        self,
        completion_tokens: int,
        metrics: dict[str, Any] | None,
        cached_tokens: int | None = None,
    ) -> bytes:
        text = "".join(self._parts)
        done = self._response("completed", completion_tokens, text, cached_tokens)
        if self.keep is not None:
            self.keep(self.id, done)
        [item] = done["output"]
        return b"".join([
            self._event("response.output_text.done", item_id=self.item_id, output_index=0,
                        content_index=0, text=text, logprobs=[]),
            self._event("response.content_part.done", item_id=self.item_id, output_index=0,
                        content_index=0, part=item["content"][0]),
            self._event("response.output_item.done", output_index=0, item=item),
            self._event("response.completed", response=done),
        ])  # fmt: skip

    def full_response(
        self,
        text: str,
        finish_reason: str,
        completion_tokens: int,
        metrics: dict[str, Any] | None,
        cached_tokens: int | None = None,
    ) -> bytes:
        body = self._response("completed", completion_tokens, text, cached_tokens)
        if self.keep is not None:
            self.keep(self.id, body)
        return _json(body).encode()

    def _event(self, kind: str, **fields: Any) -> bytes:
        body = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return f"event: {kind}\ndata: {_json(body)}\n\n".encode()

    def _response(
        self,
        status: str,
        completion_tokens: int | None,
        text: str = "",
        cached_tokens: int | None = None,
    ) -> dict[str, Any]:
        """The response object; its usage's cached tokens are 0 unless the server says them
        (vLLM copies its prompt token details there)."""
        output: list[dict[str, Any]] = []
        if status == "completed":
            content: dict[str, Any] = {
                "type": "output_text",
                "text": text,
                "annotations": [],
                "logprobs": None,
            }
            output = [{"id": self.item_id, "type": "message", "role": "assistant",
                       "status": "completed", "content": [content]}]  # fmt: skip
        usage = None
        if completion_tokens is not None:
            usage = {
                "input_tokens": self.g.prompt_tokens,
                "input_tokens_details": {"cached_tokens": cached_tokens or 0},
                "output_tokens": completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": self.g.prompt_tokens + completion_tokens,
            }
        cut = completion_tokens is not None and completion_tokens >= self.g.max_tokens
        return {
            "id": self.id, "object": "response", "created_at": self.created,
            "model": self.g.model, "status": "incomplete" if cut else status,
            "output": output, "usage": usage,
            "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
            "instructions": None, "max_output_tokens": self.g.max_tokens, "metadata": None,
            "parallel_tool_calls": True, "previous_response_id": None, "reasoning": None,
            "service_tier": "auto", "temperature": None, "tool_choice": "auto", "tools": [],
            "top_p": None, "truncation": "disabled", "background": False, "user": None,
        }  # fmt: skip


STOP_REASONS = {"stop": "end_turn", "length": "max_tokens"}  # vLLM's map to Anthropic's


class MessagesWriter:
    """Anthropic-style `/v1/messages` bodies and named SSE events, as vLLM 0.32 converts its
    chat stream: `message_start` (usage so far), `content_block_start`, one
    `content_block_delta` per piece of text, `content_block_stop`, `message_delta` with the
    stop reason and the final usage, then `message_stop` (no `[DONE]`)."""

    def __init__(self, generation: Generation) -> None:
        self.g = generation
        self.id = f"msg_{uuid.uuid4().hex}"
        self._finish = "stop"

    def opening(self) -> bytes:
        start = self._message([], None, 0)
        return b"".join([
            self._event("message_start", message=start),
            self._event("content_block_start", index=0,
                        content_block={"type": "text", "text": ""}),
        ])  # fmt: skip

    def text_chunk(self, text: str, finish_reason: str | None, completion_tokens: int) -> bytes:
        self._finish = finish_reason or self._finish
        delta = {"type": "text_delta", "text": text}
        return self._event("content_block_delta", index=0, delta=delta)

    def closing(
        self,
        completion_tokens: int,
        metrics: dict[str, Any] | None,
        cached_tokens: int | None = None,
    ) -> bytes:
        delta = {"stop_reason": STOP_REASONS.get(self._finish, "end_turn"),
                 "stop_sequence": None}  # fmt: skip
        return b"".join([
            self._event("content_block_stop", index=0),
            self._event("message_delta", delta=delta, usage=self._usage(completion_tokens)),
            self._event("message_stop"),
        ])  # fmt: skip

    def full_response(
        self,
        text: str,
        finish_reason: str,
        completion_tokens: int,
        metrics: dict[str, Any] | None,
        cached_tokens: int | None = None,
    ) -> bytes:
        content = [{"type": "text", "text": text}]
        body = self._message(content, STOP_REASONS.get(finish_reason, "end_turn"),
                             completion_tokens)  # fmt: skip
        return _json(body).encode()

    def _message(
        self, content: list[dict[str, Any]], stop_reason: str | None, completion_tokens: int
    ) -> dict[str, Any]:
        return {"id": self.id, "type": "message", "role": "assistant", "content": content,
                "model": self.g.model, "stop_reason": stop_reason, "stop_sequence": None,
                "usage": self._usage(completion_tokens)}  # fmt: skip

    def _usage(self, completion_tokens: int) -> dict[str, int]:
        return {"input_tokens": self.g.prompt_tokens, "output_tokens": completion_tokens}

    def _event(self, kind: str, **fields: Any) -> bytes:
        return f"event: {kind}\ndata: {_json({'type': kind, **fields})}\n\n".encode()
