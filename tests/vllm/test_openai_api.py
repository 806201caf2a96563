"""The official `openai` client through the gateway to real vLLM servers, one per method:
chat, completions and streaming with usage, each recorded in the ledger with exact tokens."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import openai
import pytest

from tests.e2e.conftest import ModuleGatewayStarter, Server, wait_for_usage_records
from tests.vllm.conftest import RealServer, backend_name, fleet_entry

pytestmark = pytest.mark.vllm

KEYS = ["plain", "ngram", "self-draft", "p-eagle", "dflash"]
MAX_TOKENS = 12
GREEDY = {"temperature": 0, "extra_body": {"ignore_eos": True}}
MESSAGES = [{"role": "user", "content": "Write a function that adds two numbers."}]


@pytest.fixture(scope="module")
def gateway(
    vllm_servers: dict[str, RealServer], start_module_gateway: ModuleGatewayStarter
) -> tuple[Server, str]:
    return start_module_gateway([fleet_entry(s) for s in vllm_servers.values()])


@pytest.fixture(scope="module")
def client(gateway: tuple[Server, str]) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=f"{gateway[0].base_url}/v1", api_key="unused", max_retries=0, timeout=120
    ) as llm:
        yield llm


def _request_id() -> dict[str, dict[str, str]]:
    return {"extra_headers": {"x-request-id": f"vllm-{uuid.uuid4().hex[:12]}"}}


@pytest.mark.parametrize("key", KEYS)
def test_chat_through_the_gateway(
    key: str,
    vllm_servers: dict[str, RealServer],
    client: openai.OpenAI,
    gateway: tuple[Server, str],
) -> None:
    server = vllm_servers[key]
    ids = _request_id()
    raw = client.chat.completions.with_raw_response.create(
        model=server.model,
        messages=MESSAGES,
        max_tokens=MAX_TOKENS,
        **GREEDY,
        **ids,
    )
    assert raw.headers["x-draftgate-backend"] == backend_name(server)
    assert raw.headers["x-draftgate-method"] == server.spec.method
    reply = raw.parse()
    assert reply.model == server.model
    assert reply.choices[0].finish_reason == "length"
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content
    assert reply.usage is not None
    assert reply.usage.completion_tokens == MAX_TOKENS
    # The ChatML template wraps the 8 words of the message in role markers.
    assert reply.usage.prompt_tokens > 8
    rid = ids["extra_headers"]["x-request-id"]
    record = wait_for_usage_records(gateway[1], [rid])[rid]
    assert (record["prompt_tokens"], record["completion_tokens"]) == (
        reply.usage.prompt_tokens,
        MAX_TOKENS,
    )
    assert (record["method"], record["backend_name"]) == (server.spec.method, backend_name(server))


@pytest.mark.parametrize("key", KEYS)
def test_completion_through_the_gateway(
    key: str, vllm_servers: dict[str, RealServer], client: openai.OpenAI
) -> None:
    server = vllm_servers[key]
    reply = client.completions.create(
        model=server.model,
        prompt="def add(a, b):",
        max_tokens=MAX_TOKENS,
        **GREEDY,
    )
    assert reply.object == "text_completion"
    assert reply.choices[0].text
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None
    assert reply.usage.completion_tokens == MAX_TOKENS


@pytest.mark.parametrize("key", KEYS)
def test_streaming_with_usage_matches_the_whole_answer(
    key: str, vllm_servers: dict[str, RealServer], client: openai.OpenAI
) -> None:
    server = vllm_servers[key]
    whole = client.chat.completions.create(
        model=server.model,
        messages=MESSAGES,
        max_tokens=MAX_TOKENS,
        **GREEDY,
    )
    stream = client.chat.completions.create(
        model=server.model,
        messages=MESSAGES,
        max_tokens=MAX_TOKENS,
        stream=True,
        stream_options={"include_usage": True},
        **GREEDY,
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[0].choices[0].delta.role == "assistant"
    *_, last = chunks
    assert last.choices == []
    assert last.usage is not None
    assert last.usage.completion_tokens == MAX_TOKENS
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    # Greedy decoding is deterministic: the stream says what the whole answer said.
    assert text == whole.choices[0].message.content


@pytest.mark.parametrize("key", KEYS[1:])
def test_speculative_decoding_keeps_the_greedy_answer(
    key: str, vllm_servers: dict[str, RealServer], client: openai.OpenAI
) -> None:
    """Drafts are only proposals: verified greedily, the target's answer is unchanged."""
    answers = [
        client.completions.create(
            model=vllm_servers[k].model,
            prompt="import os\n",
            max_tokens=24,
            **GREEDY,
        )
        .choices[0]
        .text
        for k in ("plain", key)
    ]
    assert answers[1] == answers[0]
