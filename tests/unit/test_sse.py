"""Usage read from an SSE stream: vLLM's compact chunks by their bytes, any other whitespace
as JSON."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from gateway.relay.sse import UsageTap, closes
from gateway.usage import Speculation


def event(body: str) -> bytes:
    return f"data: {body}\n\n".encode()


CONTENT = [
    event('{"choices":[{"index":0,"delta":{"content":" a"}}],"usage":{"completion_tokens":1}}'),
    event('{"choices":[{"index":0,"delta":{"content":" b c"}}],"usage":{"completion_tokens":3}}'),
]
USAGE = event('{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}')
DONE = b"data: [DONE]\n\n"


def relay(tap: UsageTap, chunks: list[bytes]) -> bytes:
    return b"".join(tap.feed(c) for c in chunks) + tap.finish()


@pytest.mark.parametrize("strip", [True, False])
def test_usage_chunk_is_read_and_stripped_only_when_asked(strip: bool) -> None:
    tap = UsageTap(strip_usage_chunk=strip)
    out = relay(tap, [*CONTENT, USAGE, DONE])
    assert tap.usage == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
    assert out == b"".join(CONTENT) + (b"" if strip else USAGE) + DONE


def test_events_split_across_chunks_are_reassembled() -> None:
    whole = b"".join([*CONTENT, USAGE, DONE])
    cut = whole.index(b'"choices":[]') + 5
    tap = UsageTap(strip_usage_chunk=True)
    out = relay(tap, [whole[:7], whole[7:cut], whole[cut:]])
    assert out == b"".join(CONTENT) + DONE
    assert tap.usage is not None
    assert tap.usage["completion_tokens"] == 3


def test_a_stream_cut_short_takes_usage_from_its_last_chunk() -> None:
    tap = UsageTap(strip_usage_chunk=True)
    out = relay(tap, CONTENT)
    assert out == b"".join(CONTENT)
    assert tap.usage == {"completion_tokens": 3}


def test_without_any_usage_there_is_none() -> None:
    tap = UsageTap(strip_usage_chunk=False)
    relay(tap, [event('{"choices":[{"index":0,"text":"x"}]}'), DONE])
    assert tap.usage is None


def named(kind: str, body: str) -> bytes:
    return f"event: {kind}\ndata: {body}\n\n".encode()


RESPONSES = [
    named("response.created", '{"type":"response.created","response":{"usage":null}}'),
    named("response.output_text.delta", '{"type":"response.output_text.delta","delta":" a"}'),
    named("response.completed", '{"type":"response.completed","response":{"status":"completed",'
          '"usage":{"input_tokens":5,"output_tokens":3,"total_tokens":8}}}'),
]  # fmt: skip


@pytest.mark.parametrize("cut", [0, 3, 40])
def test_responses_usage_is_read_from_response_completed(cut: int) -> None:
    whole = b"".join(RESPONSES)
    chunks = [whole] if not cut else [whole[:cut], whole[cut:]]
    tap = UsageTap(strip_usage_chunk=True)
    assert relay(tap, chunks) == whole  # nothing of the Responses stream is cut out
    assert tap.usage == {"input_tokens": 5, "output_tokens": 3, "total_tokens": 8}


CONTINUOUS = [
    event('{"choices":[{"index":0,"delta":{"content":" a"}}],"usage":{"prompt_tokens":5,'
          '"total_tokens":6,"completion_tokens":1}}'),
    event('{"choices":[{"index":0,"delta":{"content":" b"}}],"usage":{"prompt_tokens":5,'
          '"total_tokens":8,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":0}}}'),
]  # fmt: skip


@pytest.mark.parametrize("cut", [0, 30, 90])
def test_chunk_usage_is_cut_out_unless_asked_and_still_counted(cut: int) -> None:
    """Usage the gateway asked for on every chunk never reaches a client that did not ask
    for it, and a stream cut before its usage chunk still knows its counts."""
    whole = b"".join(CONTINUOUS)
    chunks = [whole] if not cut else [whole[:cut], whole[cut:]]
    tap = UsageTap(strip_usage_chunk=True, strip_chunk_usage=True)
    out = relay(tap, chunks)
    assert b"usage" not in out
    assert out == (
        event('{"choices":[{"index":0,"delta":{"content":" a"}}]}')
        + event('{"choices":[{"index":0,"delta":{"content":" b"}}]}')
    )
    assert tap.usage is not None
    assert tap.usage["completion_tokens"] == 3  # from the last chunk, as it came
    kept = UsageTap(strip_usage_chunk=False, strip_chunk_usage=False)
    assert relay(kept, chunks) == whole


MESSAGES = [
    named("message_start", '{"type":"message_start","message":{"usage":{"input_tokens":5,'
          '"output_tokens":0}}}'),
    named("content_block_delta", '{"type":"content_block_delta","delta":{"text":" a"}}'),
    named("message_delta", '{"type":"message_delta","usage":{"input_tokens":5,'
          '"output_tokens":3}}'),
    named("message_stop", '{"type":"message_stop"}'),
]  # fmt: skip


@pytest.mark.parametrize("split", [False, True])
def test_messages_usage_is_read_from_message_delta(split: bool) -> None:
    """Anthropic-style streams end with `message_stop`; their usage is in `message_delta`."""
    chunks = MESSAGES if split else [b"".join(MESSAGES)]
    tap = UsageTap(strip_usage_chunk=True)
    assert relay(tap, chunks) == b"".join(MESSAGES)
    assert tap.usage == {"input_tokens": 5, "output_tokens": 3}


# --- Usage written with other whitespace than vLLM's compact JSON ---------------------------

HEAD = {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "m"}
FINAL = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}


def content(text: str, completion: int | None) -> dict[str, Any]:
    """A content chunk, with cumulative usage (None: `"usage": null`, as OpenAI writes)."""
    choice = {"index": 0, "delta": {"content": text}, "finish_reason": None}
    usage = None if completion is None else FINAL | {"completion_tokens": completion}
    return HEAD | {"choices": [choice], "usage": usage}


BODIES = [content(" a", 1), content(' b "usage": {', 3)]
USAGE_ONLY = HEAD | {"choices": [], "usage": FINAL}


def spaced(body: dict[str, Any]) -> bytes:
    """One event as `json.dumps` writes it by default (`"usage": {`, `"choices": []`)."""
    return f"data: {json.dumps(body)}\n\n".encode()


def pretty(body: dict[str, Any]) -> bytes:
    """One event pretty-printed over several `data:` lines (a client joins them by newlines)."""
    lines = json.dumps(body, indent=2).splitlines()
    return "".join(f"data: {line}\n" for line in lines).encode() + b"\n"


def client_reads(out: bytes) -> list[Any]:
    """What a client reads of a stream: each event's data, parsed."""
    events = []
    for event in out.split(b"\n\n")[:-1]:
        lines = event.decode().split("\n")
        data = "\n".join(line.removeprefix("data: ") for line in lines if line.startswith("data:"))
        events.append(data if data == "[DONE]" else json.loads(data))
    return events


def without(body: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != key}


@pytest.mark.parametrize("write", [spaced, pretty])
def test_spaced_usage_is_read_and_cut_out_unless_asked(write: Callable[[Any], bytes]) -> None:
    """Usage not in vLLM's compact form is still exact, and what the client did not ask for is
    still cut: the usage-only chunk and each content chunk's usage member."""
    events = [*(write(b) for b in BODIES), write(USAGE_ONLY), DONE]
    tap = UsageTap(strip_usage_chunk=True, strip_chunk_usage=True)
    out = relay(tap, events)
    assert tap.usage == FINAL
    assert client_reads(out) == [*(without(b, "usage") for b in BODIES), "[DONE]"]
    assert tap.chunks == b"".join(events[:2]).count(b"data: ") + 1  # [DONE] counts, as ever
    final_only = UsageTap(strip_usage_chunk=False, strip_chunk_usage=True)
    reads = client_reads(relay(final_only, events))
    assert reads == [*(without(b, "usage") for b in BODIES), USAGE_ONLY, "[DONE]"]
    everything = UsageTap(strip_usage_chunk=False, strip_chunk_usage=False)
    assert relay(everything, events) == b"".join(events)  # as it came, byte for byte
    assert everything.usage == FINAL


@pytest.mark.parametrize("write", [spaced, pretty])
@pytest.mark.parametrize("strip", [True, False])
def test_spaced_events_split_at_every_byte_give_the_same(
    write: Callable[[Any], bytes], strip: bool
) -> None:
    whole = b"".join([*(write(b) for b in BODIES), write(USAGE_ONLY), DONE])
    expected = relay(UsageTap(strip, strip), [whole])
    assert (b'"usage"' in expected) is not strip
    for cut in range(len(whole) + 1):
        tap = UsageTap(strip, strip)
        assert relay(tap, [whole[:cut], whole[cut:]]) == expected, cut
        assert tap.usage == FINAL, cut
    tap = UsageTap(strip, strip)
    assert relay(tap, [whole[i : i + 1] for i in range(len(whole))]) == expected
    assert tap.usage == FINAL


@pytest.mark.parametrize("write", [spaced, pretty])
def test_a_spaced_stream_cut_short_takes_usage_from_its_last_chunk(
    write: Callable[[Any], bytes],
) -> None:
    tap = UsageTap(strip_usage_chunk=True, strip_chunk_usage=True)
    relay(tap, [write(b) for b in BODIES])
    assert tap.usage == FINAL


def test_null_usage_is_passed_as_it_came_and_the_usage_chunk_still_counts() -> None:
    """OpenAI's form: `"usage": null` on each content chunk, then the usage-only chunk. An
    event with nothing to cut keeps its bytes."""
    nulls = [spaced(content(" a", None)), spaced(content(" b", None))]
    tap = UsageTap(strip_usage_chunk=True, strip_chunk_usage=True)
    assert relay(tap, [*nulls, spaced(USAGE_ONLY), DONE]) == b"".join([*nulls, DONE])
    assert tap.usage == FINAL


def test_spaced_named_events_carry_their_usage() -> None:
    """Responses and messages streams written with spaces are counted as their compact form."""
    completed = {"type": "response.completed", "response": {"status": "completed",
                 "usage": {"input_tokens": 5, "output_tokens": 3}}}  # fmt: skip
    delta = {"type": "message_delta", "usage": {"input_tokens": 5, "output_tokens": 3}}
    for kind, body in [("response.completed", completed), ("message_delta", delta)]:
        events = named("x", '{"type": "x", "usage": null}') + named(kind, json.dumps(body))
        tap = UsageTap(strip_usage_chunk=True)
        assert relay(tap, [events[:9], events[9:]]) == events
        assert tap.usage == {"input_tokens": 5, "output_tokens": 3}


# vLLM's own form, field for field: a content chunk is HEAD + choices + usage member + "}".
VLLM_HEAD = '{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":'
VLLM_CHOICES = [
    '[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]',
    '[{"index":0,"delta":{"content":" the \\"usage\\": {"},"logprobs":null,"finish_reason":null}]',
    '[{"index":0,"delta":{"content":"."},"logprobs":null,"finish_reason":"stop",'
    '"stop_reason":null}]',
]
VLLM_USAGE = [
    ',"usage":{"prompt_tokens":5,"total_tokens":5,"completion_tokens":0}',
    ',"usage":{"prompt_tokens":5,"total_tokens":7,"completion_tokens":2}',
    ',"usage":{"prompt_tokens":5,"total_tokens":8,"completion_tokens":3,'
    '"prompt_tokens_details":{"cached_tokens":0}}',
]
VLLM_LAST = (
    '{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],'
    '"usage":{"prompt_tokens":5,"total_tokens":8,"completion_tokens":3}}'
)


@pytest.mark.parametrize("final", [True, False])
@pytest.mark.parametrize("every_chunk", [True, False])
def test_vllm_compact_chunks_are_cut_by_their_bytes(final: bool, every_chunk: bool) -> None:
    """vLLM's compact form comes out byte for byte as the usage patterns cut it: the usage
    member gone and nothing else touched, however the bytes were cut into reads."""
    usages = VLLM_USAGE if every_chunk else ["" for _ in VLLM_USAGE]
    chunks = [event(VLLM_HEAD + c + u + "}") for c, u in zip(VLLM_CHOICES, VLLM_USAGE, strict=True)]
    expected = [event(VLLM_HEAD + c + u + "}") for c, u in zip(VLLM_CHOICES, usages, strict=True)]
    whole = b"".join([*chunks, event(VLLM_LAST), DONE])
    want = b"".join([*expected, event(VLLM_LAST) if final else b"", DONE])
    for cut in [None, *range(len(whole) + 1)]:
        reads = [*chunks, event(VLLM_LAST), DONE] if cut is None else [whole[:cut], whole[cut:]]
        tap = UsageTap(strip_usage_chunk=not final, strip_chunk_usage=not every_chunk)
        assert relay(tap, reads) == want, cut
        assert tap.usage == {"prompt_tokens": 5, "total_tokens": 8, "completion_tokens": 3}


def test_vllm_chunks_and_chunks_without_usage_are_not_parsed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The hot path: no JSON parse for a chunk without a usage key, nor for vLLM's compact
    usage; the last usage is parsed once, at the end."""
    parsed: list[bytes] = []
    loads = orjson.loads

    def counting(data: bytes) -> Any:
        parsed.append(data)
        return loads(data)

    monkeypatch.setattr(orjson, "loads", counting)
    chunks = [event(VLLM_HEAD + c + u + "}") for c, u in zip(VLLM_CHOICES, VLLM_USAGE, strict=True)]
    tap = UsageTap(strip_usage_chunk=True, strip_chunk_usage=True)
    for chunk in [event('{"choices":[{"index":0,"text":"x"}]}'), *chunks]:
        tap.feed(chunk)
    assert parsed == []
    tap.finish()
    assert len(parsed) == 1
    assert tap.usage is not None
    assert tap.usage["completion_tokens"] == 3


# --- Lines ending in `\r\n` (sse-starlette's default) or `\r`, as the SSE standard allows ---


def ending(data: bytes, line_end: bytes) -> bytes:
    r"""`data` written with `line_end` for `\n` (JSON strings hold no raw newline)."""
    return data.replace(b"\n", line_end)


def vllm_events(every_chunk: bool) -> list[bytes]:
    """vLLM's content chunks, with their usage or without."""
    usages = VLLM_USAGE if every_chunk else ["" for _ in VLLM_USAGE]
    return [event(VLLM_HEAD + c + u + "}") for c, u in zip(VLLM_CHOICES, usages, strict=True)]


VLLM_FINAL = {"prompt_tokens": 5, "total_tokens": 8, "completion_tokens": 3}


@pytest.mark.parametrize("line_end", [b"\r\n", b"\r"])
@pytest.mark.parametrize("strip", [True, False])
def test_crlf_stream_split_at_every_byte_gives_the_exact_usage(
    line_end: bytes, strip: bool
) -> None:
    r"""Events ending in `\r\n\r\n` (or `\r\r`) give the exact usage however the reads cut
    them, and what the client did not ask for is cut out, the rest kept byte for byte."""
    whole = ending(b"".join([*vllm_events(True), event(VLLM_LAST), DONE]), line_end)
    kept = [*vllm_events(not strip), b"" if strip else event(VLLM_LAST), DONE]
    want = ending(b"".join(kept), line_end)
    for cut in range(len(whole) + 1):
        tap = UsageTap(strip_usage_chunk=strip, strip_chunk_usage=strip)
        assert relay(tap, [whole[:cut], whole[cut:]]) == want, cut
        assert tap.usage == VLLM_FINAL, cut
    tap = UsageTap(strip_usage_chunk=strip, strip_chunk_usage=strip)
    assert relay(tap, [whole[i : i + 1] for i in range(len(whole))]) == want
    assert tap.usage == VLLM_FINAL


@pytest.mark.parametrize("line_end", [b"\r\n", b"\r"])
@pytest.mark.parametrize("strip", [True, False])
def test_crlf_events_are_forwarded_as_soon_as_whole(line_end: bytes, strip: bool) -> None:
    """Each event comes out of the read that completes it, not at the end of the stream."""
    events = [ending(e, line_end) for e in [*vllm_events(True), event(VLLM_LAST), DONE]]
    kept = [ending(e, line_end) for e in vllm_events(not strip)]
    want = [*kept, b"" if strip else events[-2], events[-1]]
    tap = UsageTap(strip_usage_chunk=strip, strip_chunk_usage=strip)
    assert [tap.feed(e) for e in events] == want
    assert tap.finish() == b""
    assert tap.usage == VLLM_FINAL
    halves = UsageTap(strip_usage_chunk=strip, strip_chunk_usage=strip)
    for e, out in zip(events, want, strict=True):
        middle = len(e) - 3  # inside the separator: the event is not whole yet
        assert (halves.feed(e[:middle]), halves.feed(e[middle:])) == (b"", out)
    assert halves.usage == VLLM_FINAL


def with_id(number: int, line_end: bytes, body: bytes) -> bytes:
    """One event as sse-starlette writes it with an id: `id:` then `data:` lines, then an
    empty line, each ending in `line_end`."""
    return ending(f"id: {number}\n".encode() + body, line_end)


@pytest.mark.parametrize("write", [spaced, pretty])
@pytest.mark.parametrize("line_end", [b"\r\n", b"\r"])
def test_spaced_crlf_events_are_read_and_rewritten_with_their_line_ends(
    write: Callable[[Any], bytes], line_end: bytes
) -> None:
    r"""Spaced JSON on `\r\n` lines is read as JSON; an event written again for its usage
    keeps its `id:` line and its line ends, and comes out as its `\n` twin, line ends aside."""
    bodies = [*BODIES, USAGE_ONLY]
    lf = [*(with_id(n, b"\n", write(b)) for n, b in enumerate(bodies)), DONE]
    cr = [*(with_id(n, line_end, write(b)) for n, b in enumerate(bodies)), ending(DONE, line_end)]
    whole = b"".join(cr)
    for strip in [True, False]:
        lf_tap = UsageTap(strip, strip)
        want = ending(relay(lf_tap, lf), line_end)
        assert lf_tap.usage == FINAL
        assert (b'"usage"' in want) is not strip
        assert want.startswith(ending(b"id: 0\ndata: {", line_end))
        for cut in range(len(whole) + 1):
            tap = UsageTap(strip, strip)
            assert relay(tap, [whole[:cut], whole[cut:]]) == want, cut
            assert (tap.usage, tap.chunks) == (FINAL, lf_tap.chunks), cut
    assert relay(UsageTap(False), [whole]) == whole


def test_a_crlf_stream_cut_short_takes_usage_from_its_last_chunk() -> None:
    tap = UsageTap(strip_usage_chunk=True, strip_chunk_usage=True)
    relay(tap, [ending(e, b"\r\n") for e in vllm_events(True)])
    assert tap.usage == VLLM_FINAL | {"prompt_tokens_details": {"cached_tokens": 0}}


SPEC = {"num_spec_steps": 4, "num_draft_tokens": 28, "num_accepted_draft_tokens": 9}


@pytest.mark.parametrize("spaced", [False, True])
def test_the_requests_own_speculation_is_read_from_its_usage_chunk(spaced: bool) -> None:
    body = {
        "choices": [],
        "usage": {"prompt_tokens": 5, "completion_tokens": 13},
        "metrics": {"speculative_decoding": SPEC | {"mean_acceptance_length": 3.25}},
    }
    usage = event(json.dumps(body) if spaced else orjson.dumps(body).decode())
    tap = UsageTap(strip_usage_chunk=True)
    assert relay(tap, [*CONTENT, usage, DONE]) == b"".join(CONTENT) + DONE
    assert tap.speculation == Speculation(4, 28, 9)
    assert tap.usage == {"prompt_tokens": 5, "completion_tokens": 13}
    plain = UsageTap(strip_usage_chunk=True)
    relay(plain, [*CONTENT, USAGE, DONE])
    assert plain.speculation is None  # not reported: none, never zeros


@pytest.mark.parametrize("spaced", [False, True])
@pytest.mark.parametrize("line_end", [b"\n", b"\r\n"])
def test_the_block_is_cut_from_the_usage_chunk_the_client_asked_for_but_still_read(
    spaced: bool, line_end: bytes
) -> None:
    timing = {"time_to_first_token_ms": 12.5}  # other per-request metrics stay
    body = {
        "choices": [],
        "usage": {"prompt_tokens": 5, "completion_tokens": 13},
        "metrics": {"speculative_decoding": SPEC} | timing,
    }
    usage = event(json.dumps(body) if spaced else orjson.dumps(body).decode())
    stream = [ending(e, line_end) for e in [*CONTENT, usage, DONE]]
    tap = UsageTap(strip_usage_chunk=False, strip_speculation=True)
    relayed = relay(tap, stream)
    assert b"speculative_decoding" not in relayed
    assert tap.speculation == Speculation(4, 28, 9)
    assert tap.usage == {"prompt_tokens": 5, "completion_tokens": 13}
    last = relayed.split(line_end * 2)[-3]
    assert orjson.loads(last.removeprefix(b"data: ")) == {**body, "metrics": timing}
    kept = UsageTap(strip_usage_chunk=False)  # asked for: the stream as it came
    assert relay(kept, stream) == b"".join(stream)


def test_the_block_is_cut_from_a_responses_stream_with_its_empty_metrics() -> None:
    completed = named(
        "response.completed",
        orjson.dumps(
            {"type": "response.completed", "response": {
                "status": "completed", "usage": {"input_tokens": 5, "output_tokens": 3},
                "metrics": {"speculative_decoding": SPEC}}}
        ).decode(),
    )  # fmt: skip
    tap = UsageTap(strip_usage_chunk=True, strip_speculation=True, named_events=True)
    relayed = relay(tap, [*RESPONSES[:2], completed])
    assert relayed.startswith(b"".join(RESPONSES[:2]))
    assert relayed.endswith(b"\n\n")
    assert b"metrics" not in relayed
    assert b"event: response.completed\n" in relayed
    assert tap.speculation == Speculation(4, 28, 9)
    assert tap.usage == {"input_tokens": 5, "output_tokens": 3}


@pytest.mark.parametrize(
    ("data", "closing"),
    [
        (b"data: [DONE]\n\n", True),
        (b'data: {"choices":[]}\n\ndata: [DONE]\n\n', True),
        (b"data: [DONE]\r\n\r\n", True),
        (b'data: {"a":1}\r\rdata: [DONE]\r\r', True),
        (b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n', False),
        (b'data: {"content":"say data: [DONE]\n\n', False),  # inside a line, not an event
        (b"data: [DONE]\n", False),  # not yet a whole event
    ],
)
def test_a_stream_closes_on_its_done_event_alone(data: bytes, closing: bool) -> None:
    assert closes(data) is closing
