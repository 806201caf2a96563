"""A sampled answer's text, for the lossless watchdog (gateway/relay/shadow.py): which
requests are greedy, and the first choice's text, read from a whole body or gathered from a
stream's deltas however its chunks are cut."""

from __future__ import annotations

from collections.abc import Mapping
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

    def whole(self, body: dict[str, Any] | None) -> None:
        """A whole response's first choice."""
        choice = _first_choice(body)
        if choice is not None:
            self._add(choice.get("message"), choice.get("text"))

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

    def text(self) -> str | None:
        """The answer as compared (None: too long to compare)."""
        if self.size > MAX_CHARS:
            return None
        return "\x1e".join("".join(self.parts[p]) for p in PARTS)

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


def common_prefix(a: str, b: str) -> int:
    """How many leading characters `a` and `b` share."""
    unequal = (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    return next(unequal, min(len(a), len(b)))
