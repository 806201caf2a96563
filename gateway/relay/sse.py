"""Reading usage out of an OpenAI SSE stream without parsing its chunks (pure).

Chat and text completions: the gateway asks the backend for `include_usage` and
`continuous_usage_stats`, so every chunk carries cumulative usage and the last one before
`[DONE]` is a `"choices":[]` usage chunk. Bytes pass through untouched; only the usage-only
chunk is cut out when the client did not ask for it (a client indexing `choices[0]` would
fail on it), and so is each content chunk's `usage` when it did not ask for continuous
usage (a client adding up per-chunk usage would over-count). The last chunk is kept as it
came, and parsed once at the end, so even a stream cut short knows its exact token counts.

The Responses API streams named events (`event: response.output_text.delta` then its
`data:` line) and ends with `response.completed`, whose `response.usage` holds the counts
(`input_tokens`, `output_tokens`). Anthropic-style `/v1/messages` streams put theirs in
`message_delta`, before `message_stop`. So the tap keeps the last event that carries a
usage object, and reads it once at the end.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

USAGE_ONLY = b'"choices":[]'
CHUNK_USAGE = b',"usage":{'
USAGE = b'"usage":{'  # a usage object, not `"usage":null`
EVENT_END = b"\n\n"
DATA = b"data: "
DONE = b"data: [DONE]"
# A usage member whose object holds no object (vLLM's: counts, and details that are null): cut
# by one regex pass in C; any other (nested details) by walking its braces.
FLAT_CHUNK_USAGE = re.compile(rb',"usage":\{[^{}]*\}')


class UsageTap:
    """Watches a relayed SSE byte stream for usage."""

    __slots__ = ("_carry", "_last_usage", "_strip", "_strip_chunk_usage", "chunks", "usage")

    def __init__(self, strip_usage_chunk: bool, strip_chunk_usage: bool = False) -> None:
        self._strip = strip_usage_chunk
        self._strip_chunk_usage = strip_chunk_usage
        self._carry = b""
        self._last_usage = b""  # the last chunk (or event) with a usage object, as it came
        self.chunks = 0  # events with content forwarded
        self.usage: dict[str, Any] | None = None

    def feed(self, data: bytes) -> bytes:
        """Return the bytes to forward for this upstream chunk."""
        if not self._carry and data.endswith(EVENT_END) and USAGE_ONLY not in data:
            self.chunks += data.count(DATA)
            if USAGE in data:
                self._last_usage = data  # the common case: whole events, no usage chunk
            if self._strip_chunk_usage and CHUNK_USAGE in data:
                return without_usage(data)
            return data
        return self._split(self._carry + data)

    def _split(self, data: bytes) -> bytes:
        """Handle whole events one by one; hold back a trailing partial event."""
        events = data.split(EVENT_END)
        self._carry = events.pop()  # an incomplete event, or b"" after a final separator
        kept = []
        for event in events:
            if USAGE_ONLY in event and event.startswith(DATA):
                self.usage = _usage(event)
                if self._strip:
                    continue
            else:
                self.chunks += event.count(DATA)  # counted whole, however the bytes were cut
                if USAGE in event:
                    self._last_usage = event
                if self._strip_chunk_usage and CHUNK_USAGE in event:
                    event = without_usage(event)
            kept.append(event + EVENT_END)
        return b"".join(kept)

    def finish(self) -> bytes:
        """Bytes still held back at the end of the stream; settles `usage`."""
        rest, self._carry = self._carry, b""
        self.chunks += rest.count(DATA)
        if self.usage is None:
            self.usage = _usage(_last_data(self._last_usage))
        return rest


def without_usage(data: bytes) -> bytes:
    """`data` with every `,"usage":{...}` member cut out (a usage object holds no strings,
    so its braces are its own); a member cut off unclosed is left as it is."""
    data = FLAT_CHUNK_USAGE.sub(b"", data)
    at = data.find(CHUNK_USAGE)
    while at >= 0:
        end = _object_end(data, at + len(CHUNK_USAGE) - 1)
        if end is None:
            return data
        data = data[:at] + data[end:]
        at = data.find(CHUNK_USAGE, at)
    return data


def _object_end(data: bytes, start: int) -> int | None:
    """The index just past the object opening at `start` (None: it is not closed)."""
    depth, at = 0, start
    while True:
        opening, closing = data.find(b"{", at), data.find(b"}", at)
        if closing < 0:
            return None
        if 0 <= opening < closing:
            depth, at = depth + 1, opening + 1
            continue
        depth, at = depth - 1, closing + 1
        if depth == 0:
            return at


def _data_line(event: bytes) -> bytes | None:
    """The `data: ...` line of one event (after an `event:` line, if named)."""
    if event.startswith(DATA):
        return event
    at = event.find(b"\n" + DATA)
    return None if at < 0 else event[at + 1 :]


def _last_data(data: bytes) -> bytes:
    """The last `data: {...}` line with a usage object in a chunk (a chunk may hold several
    events)."""
    lines = [_data_line(e) for e in data.split(EVENT_END) if USAGE in e]
    found = [line for line in lines if line is not None]
    return found[-1] if found else b""


def _usage(event: bytes) -> dict[str, Any] | None:
    """The `usage` object of one event, if it has one: at the top (completions,
    `message_delta`), or in the `response` (`response.completed`) or `message`
    (`message_start`) it carries."""
    line = _data_line(event)
    if line is None:
        return None
    try:
        body = orjson.loads(line[len(DATA) :].strip())
    except orjson.JSONDecodeError:
        return None
    if not isinstance(body, dict):
        return None
    usage = body.get("usage")
    for holder in ("response", "message"):  # response.completed; message_start
        inner = body.get(holder)
        if usage is None and isinstance(inner, dict):
            usage = inner.get("usage")
    return usage if isinstance(usage, dict) else None
