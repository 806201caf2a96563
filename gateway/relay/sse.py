r"""Reading usage out of an OpenAI SSE stream, parsing JSON only where usage may be (pure).

Chat and text completions: the gateway asks the backend for `include_usage` and
`continuous_usage_stats`, so every chunk carries cumulative usage and the last one before
`[DONE]` is a usage-only chunk (its `choices` empty). Bytes pass through untouched; only the
usage-only chunk is cut out when the client did not ask for it (a client indexing
`choices[0]` would fail on it), and so is each content chunk's `usage` when it did not ask
for continuous usage (a client adding up per-chunk usage would over-count). The last event
with a usage object is kept as it came, and parsed once at the end, so even a stream cut
short knows its exact token counts.

Usage is found whatever the JSON's whitespace. An event without a `"usage"` key (its name
holds no whitespace, only what follows it may) passes as it came and is never parsed.
vLLM and SGLang write compact JSON, so in their events every usage member is
`,"usage":{...}` or `"usage":null` and the usage-only chunk says `"choices":[]`: those are
found and cut by their bytes, with no JSON parse per chunk. An event where any `usage` or
`choices` key is written otherwise (`"usage": {`, pretty-printed over several `data:` lines)
is parsed as JSON, and written again, compact on one `data:` line, only when its usage
member is cut.

Lines may end in `\r\n`, `\r` or `\n`, as the SSE standard allows: an event ends at
`\n\n` (vLLM, SGLang), `\r\n\r\n` (sse-starlette's default) or `\r\r`, and is forwarded
with its own separator as soon as it is whole. A read that ends where an event does (with
what was held back before it) is not split at all; another is split on `\n\n` alone unless
it holds a `\r` (JSON strings hold none unescaped, so vLLM's and SGLang's reads never do).

The Responses API streams named events (`event: response.output_text.delta` then its
`data:` line) and ends with `response.completed`, whose `response.usage` holds the counts
(`input_tokens`, `output_tokens`). Anthropic-style `/v1/messages` streams put theirs in
`message_delta`, before `message_stop`. So the tap keeps the last event that carries a
usage object, and reads it once at the end.
"""

from __future__ import annotations

import re
from typing import Any, Literal

import orjson

from gateway.usage import RESPONSE_ID_CHARS, Speculation, cut_speculation, speculation_in

USAGE_KEY = b'"usage"'  # in every event that may hold usage, whatever its whitespace
SPECULATION_KEY = b'"speculative_decoding"'  # the engine's per-request block, with usage
USAGE = b'"usage":{'  # a usage object, not `"usage":null`
CHUNK_USAGE = b',"usage":{'
NULL_USAGE = b'"usage":null'
CHOICES = b'"choices"'
CONTENT_CHOICES = b'"choices":[{'
USAGE_ONLY = b'"choices":[]'
EVENT_END = b"\n\n"
CRLF_EVENT_END = b"\r\n\r\n"
# `\r`, in a read only when its lines end in `\r\n` or `\r`; an int, as `int in bytes` is a
# memchr where a bytes needle costs 0.15 us more (a TypeError raised and cleared first)
CR = 0x0D
# An event's end whatever its lines end in (`\n\r\n` and the like, mixed, are not looked for).
EVENT_ENDS = re.compile(rb"(\r\n\r\n|\n\n|\r\r)")
LINE_ENDS = re.compile(rb"\r\n|\r|\n")
DATA = b"data: "
DATA_FIELD = b"data:"  # the space after it is optional
NEXT_DATA = b"\ndata: "
DONE = b"data: [DONE]"
# A usage member whose object holds no object (vLLM's: counts, and details that are null): cut
# by one regex pass in C; any other (nested details) by walking its braces.
FLAT_CHUNK_USAGE = re.compile(rb',"usage":\{[^{}]*\}')

Form = Literal["content", "compact", "other"]


class UsageTap:
    """Watches a relayed SSE byte stream for usage."""

    __slots__ = (
        "_carry",
        "_last_usage",
        "_scan_speculation",
        "_strip",
        "_strip_chunk_usage",
        "_strip_speculation",
        "chunks",
        "speculation",
        "usage",
    )

    def __init__(
        self,
        strip_usage_chunk: bool,
        strip_chunk_usage: bool = False,
        strip_speculation: bool = False,
        named_events: bool = False,
    ) -> None:
        self._strip = strip_usage_chunk
        self._strip_chunk_usage = strip_chunk_usage
        # The block is cut where it comes: a completion stream's usage-only chunk, parsed
        # anyway; in a stream of named events (`named_events`: the Responses API's
        # `response.completed`) any event with usage, looked for by its bytes.
        self._strip_speculation = strip_speculation
        self._scan_speculation = strip_speculation and named_events
        self._carry = b""
        self._last_usage = b""  # the last chunk (or event) with a usage object, as it came
        self.chunks = 0  # events with content forwarded
        self.usage: dict[str, Any] | None = None
        # the request's speculative decoding, where its last usage event reported it
        self.speculation: Speculation | None = None

    def feed(self, data: bytes) -> bytes:
        """Return the bytes to forward for this upstream chunk."""
        if self._carry:
            data, self._carry = self._carry + data, b""
        if data.endswith(EVENT_END):  # whole events, as vLLM writes them: no split needed
            return self._forward(data)
        if CR in data:  # lines ending in `\r\n` or `\r`
            return self._forward_whole(data)
        events = data.split(EVENT_END)
        self._carry = events.pop()  # an incomplete event, or b"" after a final separator
        return self._forward(data[: len(data) - len(self._carry)], events)

    def _forward_whole(self, data: bytes) -> bytes:
        r"""The bytes to forward for the whole events of `data`, its lines ending in `\r\n` or
        `\r`; what follows the last is held back."""
        if data.endswith(CRLF_EVENT_END):  # whole events, as sse-starlette writes them
            return self._forward(data)
        events, ends = _split(data)
        self._carry = events.pop()
        return self._forward(data[: len(data) - len(self._carry)], events, ends)

    def _forward(
        self, data: bytes, events: list[bytes] | None = None, ends: list[bytes] | None = None
    ) -> bytes:
        r"""The bytes to forward for whole events (`events`: `data` split, when it was; `ends`:
        their separators, None when all are `\n\n`)."""
        usages = data.count(USAGE_KEY)
        if not usages:  # nothing to read or cut
            self.chunks += data.count(DATA)  # counted whole, however the bytes were cut
            return data
        if self._scan_speculation and SPECULATION_KEY in data:
            data = self._cut_speculation(data)
        form = _form(data, usages)
        if form == "content":  # read and cut in one pass, as vLLM streams
            self.chunks += data.count(DATA)
            self._last_usage = data
            return without_usage(data) if self._strip_chunk_usage else data
        if events is None:
            if CR in data:  # lines ending in `\r\n` or `\r`
                events, ends = _split(data)
            else:
                events = data.split(EVENT_END)
            self._carry = events.pop()  # b"", or a newline after the last separator
        handle = self._compact_event if form == "compact" else self._event
        if ends is None:
            return b"".join([handle(event) for event in events])
        return b"".join([handle(event, end) for event, end in zip(events, ends, strict=True)])

    def _event(self, event: bytes, end: bytes = EVENT_END) -> bytes:
        """The bytes to forward for one whole event of a chunk not all compact."""
        usages = event.count(USAGE_KEY)
        if not usages:
            self.chunks += event.count(DATA)
            return event + end
        if _form(event, usages) != "other":
            return self._compact_event(event, end)
        return self._parsed_event(event, end)

    def _compact_event(self, event: bytes, end: bytes = EVENT_END) -> bytes:
        """An event in vLLM's compact form, read and cut by its bytes (b"": cut out)."""
        if USAGE_ONLY in event and event.startswith(DATA) and USAGE_KEY in event:
            return self._usage_only(event, _body(event), end)
        self.chunks += event.count(DATA)
        if USAGE in event:
            self._last_usage = event
        if self._strip_chunk_usage and CHUNK_USAGE in event:
            event = without_usage(event)
        return event + end

    def _parsed_event(self, event: bytes, end: bytes = EVENT_END) -> bytes:
        """An event with usage in another form than vLLM's, read as JSON."""
        body = _body(event)
        if body is not None and body.get("choices") == []:  # the usage-only chunk
            return self._usage_only(event, body, end)
        self.chunks += event.count(DATA)
        if body is None:
            return event + end
        if _usage_in(body) is not None:
            self._last_usage = event
        if self._strip_chunk_usage and isinstance(body.get("usage"), dict):
            del body["usage"]
            event = _with_data(event, orjson.dumps(body))
        return event + end

    def _usage_only(self, event: bytes, body: dict[str, Any] | None, end: bytes) -> bytes:
        """The usage-only chunk, read; cut out unless the client asked for it, and its
        speculative decoding block cut out of it unless the client asked for that."""
        self.usage, self.speculation = _usage_in(body), speculation_in(body) or self.speculation
        if self._strip:
            return b""
        if self._strip_speculation and body is not None and cut_speculation(body):
            event = _with_data(event, orjson.dumps(body))
        return event + end

    def _cut_speculation(self, data: bytes) -> bytes:
        """Whole events with the speculative decoding block read and cut out of each that
        holds one (the gateway asked for it, not the client): parsed and written again,
        compact on one `data:` line; once a stream, in its last usage event (streams of
        named events only: a completion stream's is in its usage-only chunk)."""
        if CR in data:
            events, ends = _split(data)
        else:
            events = data.split(EVENT_END)
            ends = [EVENT_END] * (len(events) - 1)
        out = []
        for event, end in zip(events, [*ends, b""], strict=True):
            body = _body(event) if SPECULATION_KEY in event else None
            if body is not None:
                found = speculation_in(body)
                if cut_speculation(body):
                    self.speculation = found or self.speculation
                    event = _with_data(event, orjson.dumps(body))
            out.append(event + end)
        return b"".join(out)

    def response_id(self) -> str | None:
        """The id of the response a Responses API stream's last usage event carries (its
        `response.completed`), if it does."""
        events = (
            _split(self._last_usage)[0]
            if CR in self._last_usage
            else (self._last_usage.split(EVENT_END))
        )
        for event in reversed(events):
            body = _body(event)
            inner = body.get("response") if body is not None else None
            if isinstance(inner, dict) and isinstance(found := inner.get("id"), str):
                return found if len(found) <= RESPONSE_ID_CHARS else None
        return None

    def finish(self) -> bytes:
        """Bytes still held back at the end of the stream; settles `usage`."""
        rest, self._carry = self._carry, b""
        self.chunks += rest.count(DATA)
        if self.usage is None:
            self.usage = _usage_of_last(self._last_usage)
        return rest


def _form(data: bytes, usages: int) -> Form:
    """How whole events holding `usages` usage keys are written: vLLM's content chunks, each
    usage an object after another member and each choices list opening on an object
    (`content`); in vLLM's compact form with usage also null or choices also empty (`compact`);
    or not (`other`)."""
    objects = data.count(CHUNK_USAGE)
    if usages != objects and usages != objects + data.count(NULL_USAGE):
        return "other"
    choices, content = data.count(CHOICES), data.count(CONTENT_CHOICES)
    if choices == content and usages == objects:
        return "content"
    return "compact" if choices == content + data.count(USAGE_ONLY) else "other"


def _split(data: bytes) -> tuple[list[bytes], list[bytes]]:
    r"""`data` with a `\r` in it cut into its events and what follows the last (all without
    their separators), and the separator ending each event."""
    parts = EVENT_ENDS.split(data)
    return parts[::2], parts[1::2]


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


def _data_only(event: bytes) -> bool:
    r"""Whether every line of `event` is a `data: ` line ending in `\n` (no name, no id: nearly
    every event)."""
    return (
        event.startswith(DATA) and event.count(b"\n") == event.count(NEXT_DATA) and CR not in event
    )


def _lines(event: bytes) -> list[bytes]:
    """The lines of one event, whatever they end in."""
    return LINE_ENDS.split(event) if CR in event else event.split(b"\n")


def _line_end(event: bytes) -> bytes:
    """What the lines of one event end in (its first line's ending, if it has several)."""
    ending = LINE_ENDS.search(event) if CR in event else None
    return b"\n" if ending is None else ending.group()


def _data(event: bytes) -> bytes | None:
    """The data of one event: its `data:` lines' values joined by newlines, as a client reads
    them (after an `event:` line, if named); None without any."""
    if _data_only(event):
        return event[len(DATA) :].replace(NEXT_DATA, b"\n")
    values = [line[len(DATA_FIELD) :] for line in _lines(event) if line.startswith(DATA_FIELD)]
    return b"\n".join(v.removeprefix(b" ") for v in values) if values else None


def _with_data(event: bytes, data: bytes) -> bytes:
    """`event` with its `data:` lines replaced by one holding `data`, after its other fields."""
    if _data_only(event):
        return DATA + data
    fields = [line for line in _lines(event) if not line.startswith(DATA_FIELD)]
    return _line_end(event).join([*fields, DATA + data])


def _body(event: bytes) -> dict[str, Any] | None:
    """The JSON object one event's data holds, if it holds one."""
    data = _data(event)
    if data is None:
        return None
    try:
        body = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return body if isinstance(body, dict) else None


def _usage_in(body: dict[str, Any] | None) -> dict[str, Any] | None:
    """The `usage` object of one event's body, if it has one: at the top (completions,
    `message_delta`), or in the `response` (`response.completed`) or `message`
    (`message_start`) it carries."""
    if body is None:
        return None
    usage = body.get("usage")
    for holder in ("response", "message"):  # response.completed; message_start
        inner = body.get(holder)
        if usage is None and isinstance(inner, dict):
            usage = inner.get("usage")
    return usage if isinstance(usage, dict) else None


def _usage(event: bytes) -> dict[str, Any] | None:
    """The `usage` object of one event, if it has one."""
    return _usage_in(_body(event))


def _usage_of_last(data: bytes) -> dict[str, Any] | None:
    """The usage of the last event in `data` that has a usage object (a chunk may hold
    several events)."""
    events = _split(data)[0] if CR in data else data.split(EVENT_END)
    for event in reversed(events):
        if USAGE_KEY in event and (usage := _usage(event)) is not None:
            return usage
    return None


DONE_EVENTS = (DONE + b"\n\n", DONE + b"\r\n\r\n", DONE + b"\r\r")


def closes(data: bytes) -> bool:
    """Whether whole events end with the stream's closing `data: [DONE]` event: once it is
    forwarded the client has its whole answer (the `openai` client closes on it)."""
    if not data.endswith(DONE_EVENTS):  # one comparison for every other chunk
        return False
    at = data.rfind(DONE)
    return at == 0 or data[at - 1 : at] in (b"\n", b"\r")


def hold_done(data: bytes, held: bytes) -> tuple[bytes, bytes]:
    """`data` to forward now, and what is held back: from a closing `data: [DONE]` event on
    (whole events only reach here, so it starts a line)."""
    if held:
        return b"", held + data
    at = data.rfind(DONE)
    if at < 0 or data[at:].strip() != DONE or (at and data[at - 1 : at] != b"\n"):
        return data, held
    return data[:at], data[at:]
