"""Usage read from an SSE stream without parsing its chunks."""

from __future__ import annotations

import pytest

from gateway.relay.sse import UsageTap


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
