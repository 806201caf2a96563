"""The lossless watchdog's hot-path half: which requests it samples, how it reads an answer
(whole or streamed, however the stream is cut into chunks), and its bounds."""

from __future__ import annotations

import asyncio
import random

import orjson
import pytest

from gateway.metrics import GatewayMetrics
from gateway.registry import BackendView, KeyView
from gateway.relay.exchange import Exchange
from gateway.relay.shadow import Shadow
from gateway.relay.transcripts import (
    Sample,
    Transcript,
    common_prefix,
    cut_body_token_ids,
    cut_token_ids,
    greedy,
)

CHAT = "/v1/chat/completions"


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        ({"temperature": 0}, True),
        ({"temperature": 0.0, "n": 1}, True),
        ({"temperature": 0, "seed": 3}, True),
        ({}, False),  # vLLM's default temperature is 1
        ({"temperature": 0.7, "seed": 3}, False),  # seeded sampling: draws differ under spec
        ({"temperature": 0, "n": 2}, False),
        ({"temperature": False}, False),
        ({"temperature": "0"}, False),
    ],
)
def test_only_greedy_single_answers_are_eligible(
    payload: dict[str, object], expected: bool
) -> None:
    assert greedy(payload) is expected


def _events(*deltas: object) -> bytes:
    lines = [
        b"data: " + orjson.dumps({"choices": [{"index": 0, "delta": d}]}) + b"\n\n" for d in deltas
    ]
    return b"".join(lines) + b"data: [DONE]\n\n"


def test_a_stream_reads_as_its_whole_answer_however_it_is_cut() -> None:
    deltas = (
        {"role": "assistant", "reasoning_content": "think "},
        {"reasoning_content": "more"},
        {"content": "Hello"},
        {"content": " world"},
        {"tool_calls": [{"function": {"name": "f", "arguments": '{"a":'}}]},
        {"tool_calls": [{"function": {"arguments": "1}"}}]},
    )
    stream = _events(*deltas)
    whole = Transcript()
    whole.whole(
        {
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "reasoning_content": "think more",
                        "content": "Hello world",
                        "tool_calls": [{"function": {"name": "f", "arguments": '{"a":1}'}}],
                    },
                }
            ]
        }
    )
    for size in (1, 7, 64, len(stream)):
        streamed = Transcript()
        for at in range(0, len(stream), size):
            streamed.feed(stream[at : at + size])
        assert streamed.text() == whole.text() == 'think more\x1eHello world\x1ef{"a":1}'


def test_a_completion_reads_its_text_and_other_choices_are_ignored() -> None:
    t = Transcript()
    t.whole({"choices": [{"index": 1, "text": "no"}, {"index": 0, "text": "yes"}]})
    assert t.text() == "\x1eyes\x1e"


def test_token_ids_are_gathered_across_a_stream_and_absent_where_not_returned() -> None:
    chunks = [
        {"choices": [{"index": 0, "delta": {"role": "assistant"}, "token_ids": None}]},
        {"choices": [{"index": 0, "delta": {"content": " a b"}, "token_ids": [7, 8]}]},
        {"choices": [{"index": 1, "delta": {"content": " z"}, "token_ids": [99]}]},
        {"choices": [{"index": 0, "delta": {}, "token_ids": []}]},
        {"choices": [{"index": 0, "delta": {"content": " c"}, "token_ids": [9]}]},
    ]
    stream = b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks)
    streamed = Transcript()
    for at in range(0, len(stream), 5):
        streamed.feed(stream[at : at + 5])
    assert streamed.ids() == [7, 8, 9]
    whole = Transcript()
    whole.whole({"choices": [{"index": 0, "text": " a b c", "token_ids": [7, 8, 9]}]})
    assert whole.ids() == [7, 8, 9]
    text_only = Transcript()
    text_only.whole({"choices": [{"index": 0, "text": " a b c", "token_ids": None}]})
    assert text_only.ids() is None


def test_the_token_ids_the_gateway_asked_for_are_written_as_null_again() -> None:
    event = (
        b'data: {"choices":[{"index":0,"delta":{"content":"say \\"token_ids\\":[1]"},'
        b'"token_ids":[5, 6]}],"prompt_token_ids":[1,2,3]}\n\n'
    )
    cut = cut_token_ids(event)
    assert cut == (
        b'data: {"choices":[{"index":0,"delta":{"content":"say \\"token_ids\\":[1]"},'
        b'"token_ids":null}],"prompt_token_ids":null}\n\n'
    )
    assert orjson.loads(cut[6:])["choices"][0]["delta"]["content"] == 'say "token_ids":[1]'
    assert cut_token_ids(b'data: {"choices":[]}\n\n') == b'data: {"choices":[]}\n\n'
    body = {
        "prompt_token_ids": [1],
        "choices": [{"index": 0, "token_ids": [2], "prompt_token_ids": [1], "text": "x"}],
    }
    cut_body_token_ids(body)
    assert body == {
        "prompt_token_ids": None,
        "choices": [{"index": 0, "token_ids": None, "prompt_token_ids": None, "text": "x"}],
    }


def test_the_common_prefix_is_where_two_answers_first_differ() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix("abcdef", "abcxef") == 3
    assert common_prefix("abc", "abcdef") == 3
    assert common_prefix("", "a") == 0
    assert common_prefix("same", "same") == 4


def _shadow(share: float = 1.0, per_minute: int = 2, queue: int = 5) -> Shadow:
    metrics = GatewayMetrics()

    def store(_: object) -> None:
        return None

    return Shadow(share, per_minute, queue, {}, metrics, {}, store, random.Random(1))


def test_a_key_that_opted_out_and_other_paths_are_never_sampled() -> None:
    shadow = _shadow()
    greedy_chat = {"temperature": 0}
    assert shadow.sample(CHAT, greedy_chat, None) is not None
    assert shadow.sample("/v1/completions", greedy_chat, None) is not None
    assert shadow.sample("/v1/responses", greedy_chat, None) is None
    assert shadow.sample("/v1/embeddings", greedy_chat, None) is None
    opted = KeyView(1, "k", None, None, None, "monthly", None, lossless_opt_out=True)
    assert shadow.sample(CHAT, greedy_chat, opted) is None


def test_the_share_is_the_sampled_fraction() -> None:
    shadow = _shadow(share=0.25)
    drawn = sum(shadow.sample(CHAT, {"temperature": 0}, None) is not None for _ in range(4000))
    assert 800 <= drawn <= 1200


def _served(model: str = "m") -> Exchange:
    x = Exchange("r")
    x.model, x.status = model, 200
    x.backend = BackendView("b", "http://b", model, "dspark", 3, "B200", 1)
    x.sample = Sample(CHAT, {"temperature": 0})
    x.sample.transcript.whole({"choices": [{"index": 0, "message": {"content": "hi"}}]})
    return x


def test_replays_are_capped_per_minute_and_failed_answers_are_not_queued() -> None:
    """20 a minute: at most a tenth of them at once (2), then one every 3 s, evenly."""

    async def go() -> Shadow:
        shadow = _shadow(per_minute=20)
        failed = _served()
        failed.status, failed.outcome = 502, "upstream_error"
        shadow.offer(failed)
        for _ in range(5):
            shadow.offer(_served())
        return shadow

    shadow = asyncio.run(go())
    assert shadow.queue.qsize() == 2
    start = shadow._filled_at
    allowed = []
    for tenth in range(1, 91):  # 9 s, in tenths of a second
        now = start + tenth / 10
        if shadow._allowed(now):
            shadow._tokens -= 1
            allowed.append(round(now - start, 1))
    assert allowed == [3.0, 6.0, 9.0]
