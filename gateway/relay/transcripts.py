"""A sampled answer, for the lossless watchdog (gateway/relay/shadow.py): which requests are
greedy, and the first choice's text and token ids, read from a whole body or gathered from a
stream's deltas however its chunks are cut.

The token ids are vLLM's `return_token_ids`: the gateway asks for them on a sampled request
(and on its replay) where the backend is an engine that serves its `/version`, and cuts them
out of the answer again unless the client asked for them itself (`with_token_ids`,
`cut_token_ids`)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

MAX_CHARS = 1_000_000  # a transcript longer than this is not compared
PARTS = ("reasoning", "content", "tools")


def greedy(payload: Mapping[str, Any]) -> bool:
    """Whether a request decodes greedily with one answer: its temperature is 0."""
    temperature = payload.get("temperature")
    if isinstance(temperature, bool) or not isinstance(temperature, int | float):
        return False
    return temperature == 0 and payload.get("n", 1) in (1, None)


@dataclass(slots=True)
class Transcript:
    """The text of a request's first choice, gathered from its whole body or its stream."""

    parts: dict[str, list[str]] = field(default_factory=lambda: {p: [] for p in PARTS})
    size: int = 0
    partial: bytes = b""  # a stream's unfinished line
    token_ids: list[int] | None = None  # the choice's, where the engine returned them

    def whole(self, body: dict[str, Any] | None) -> None:
        """A whole response's first choice."""
        choice = _first_choice(body)
        if choice is not None:
            self._add(choice.get("message"), choice.get("text"))
            self._add_ids(choice.get("token_ids"))

    def feed(self, chunk: bytes) -> None:
        """Some of a stream's bytes: each complete `data:` line's first-choice delta."""
        lines = (self.partial + chunk).split(b"\n")
        self.partial = lines.pop()
        for line in lines:
            if not line.startswith(b"data:") or self.size > MAX_CHARS:
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                continue
            try:
                event = orjson.loads(data)
            except orjson.JSONDecodeError:
                continue
            choice = _first_choice(event if isinstance(event, dict) else None)
            if choice is not None:
                self._add(choice.get("delta"), choice.get("text"))
                self._add_ids(choice.get("token_ids"))

    def text(self) -> str | None:
        """The answer as compared (None: too long to compare)."""
        if self.size > MAX_CHARS:
            return None
        return "\x1e".join("".join(self.parts[p]) for p in PARTS)

    def ids(self) -> list[int] | None:
        """The answer's token ids as compared (None: the engine did not return them, or the
        answer is too long to compare)."""
        return None if self.size > MAX_CHARS else self.token_ids

    def _add_ids(self, ids: object) -> None:
        if isinstance(ids, list) and all(type(i) is int for i in ids):
            if self.token_ids is None:
                self.token_ids = []
            self.token_ids.extend(ids)

    def _add(self, message: object, text: object) -> None:
        if isinstance(text, str):
            self._put("content", text)
        if not isinstance(message, dict):
            return
        reasoning = message.get("reasoning_content", message.get("reasoning"))
        if isinstance(reasoning, str):
            self._put("reasoning", reasoning)
        if isinstance(message.get("content"), str):
            self._put("content", message["content"])
        for call in message.get("tool_calls") or ():
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict):
                for name in ("name", "arguments"):
                    if isinstance(function.get(name), str):
                        self._put("tools", function[name])

    def _put(self, part: str, text: str) -> None:
        self.parts[part].append(text)
        self.size += len(text)


def _first_choice(body: dict[str, Any] | None) -> dict[str, Any] | None:
    choices = body.get("choices") if body is not None else None
    if not isinstance(choices, list):
        return None
    for choice in choices:
        if isinstance(choice, dict) and choice.get("index", 0) == 0:
            return choice
    return None


@dataclass(slots=True)
class Sample:
    """A request chosen for a replay: what to send again, and its answer as served."""

    path: str
    payload: dict[str, Any]
    transcript: Transcript = field(default_factory=Transcript)


def common_prefix(a: Sequence[object], b: Sequence[object]) -> int:
    """How many leading characters (or tokens) `a` and `b` share."""
    unequal = (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    return next(unequal, min(len(a), len(b)))


# vLLM writes compact JSON: a choice's ids are `"token_ids":[1,2]`, the prompt's
# `"prompt_token_ids":[...]` (a JSON string holds no unescaped quote, so no text matches)
TOKEN_IDS = re.compile(rb'"(prompt_token_ids|token_ids)":\[[0-9,\s]*\]')
ASK = "return_token_ids"


def with_token_ids(payload: Mapping[str, Any]) -> dict[str, Any]:
    """The request asking the engine for its answer's token ids (vLLM's option)."""
    return {**payload, ASK: True}


def asks_token_ids(payload: Mapping[str, Any]) -> bool:
    """Whether the client asked for the token ids itself (then they are left in)."""
    return payload.get(ASK) is True


def cut_token_ids(data: bytes) -> bytes:
    """Stream events with the ids the gateway asked for written as null again, as the engine
    writes them when not asked."""
    return TOKEN_IDS.sub(rb'"\1":null', data) if b"token_ids" in data else data


def cut_body_token_ids(body: dict[str, Any]) -> None:
    """A whole answer's ids (its choices' and its prompt's) set to null, as when not asked."""
    if body.get("prompt_token_ids") is not None:
        body["prompt_token_ids"] = None
    for choice in body.get("choices") or ():
        if isinstance(choice, dict):
            for name in ("token_ids", "prompt_token_ids"):
                if choice.get(name) is not None:
                    choice[name] = None
