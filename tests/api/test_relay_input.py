"""Bad input on /v1 is refused by the gateway itself, before any backend sees it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from gateway.settings import Settings
from tests.api.test_admin_backends import EAGLE3, assert_envelope
from tests.conftest import admin_client

MODEL = EAGLE3["model"]


@pytest.fixture
async def relay_client(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """A gateway without API keys, one backend registered (unreachable: nothing may hit it)."""
    async with admin_client(settings.model_copy(update={"require_api_key": False})) as client:
        await client.post("/admin/v1/backends", json={**EAGLE3, "url": "http://127.0.0.1:9"})
        for _ in range(100):
            if (await client.get("/v1/models")).json()["data"]:
                break
            await asyncio.sleep(0.05)
        yield client


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": -5}, "max_tokens"),
        ({"max_tokens": "many"}, "max_tokens"),
        ({"max_completion_tokens": 1.5}, "max_completion_tokens"),
        ({"n": 0}, "n"),
        ({"stream": "yes"}, "stream"),
        ({"messages": []}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"model": 42}, "model"),
        ({"model": ""}, "model"),
    ],
)
async def test_invalid_completion_is_400_without_reaching_a_backend(
    relay_client: httpx.AsyncClient, body: dict[str, Any], param: str
) -> None:
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **body}
    response = await relay_client.post("/v1/chat/completions", json=chat)
    assert_envelope(response, 400, param=param)  # a backend would have made it 502


async def test_completions_need_a_prompt(relay_client: httpx.AsyncClient) -> None:
    response = await relay_client.post("/v1/completions", json={"model": MODEL})
    assert_envelope(response, 400, param="prompt")


async def test_unknown_model_is_404_model_not_found(relay_client: httpx.AsyncClient) -> None:
    chat = {"model": "nope", "messages": [{"role": "user", "content": "hi"}]}
    response = await relay_client.post("/v1/chat/completions", json=chat)
    assert_envelope(response, 404, param="model")
    assert response.json()["error"]["code"] == "model_not_found"


async def test_unreachable_backend_is_502_after_retries(relay_client: httpx.AsyncClient) -> None:
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    response = await relay_client.post("/v1/chat/completions", json=chat)
    assert_envelope(response, 502)
    assert response.json()["error"]["code"] == "upstream_error"


async def test_refusals_are_recorded_under_known_names_only(
    relay_client: httpx.AsyncClient,
) -> None:
    # A client picks the model name: refusals of names no backend serves are recorded under
    # "unknown" (as /metrics labels them), and none counts among any model's requests.
    for name in ("nope", "x" * 300, "'; drop table usage_records; --"):
        chat = {"model": name, "messages": [{"role": "user", "content": "hi"}]}
        assert (await relay_client.post("/v1/chat/completions", json=chat)).status_code == 404
    bad = {"model": MODEL, "messages": [], "max_tokens": 4}
    assert (await relay_client.post("/v1/chat/completions", json=bad)).status_code == 400
    rows: list[dict[str, Any]] = []
    for _ in range(200):  # the ledger writes every flush interval
        body = (await relay_client.get("/admin/v1/savings", params={"group_by": "model"})).json()
        rows = body["data"]
        if sum(r["refused"] for r in rows) == 4:
            break
        await asyncio.sleep(0.05)
    assert sorted((r["model"], r["requests"], r["refused"]) for r in rows) == [
        (MODEL, 0, 1),
        ("unknown", 0, 3),
    ]


def nested(chat: dict[str, Any], depth: int) -> bytes:
    """`chat` with an `extra` field of arrays nested `depth` deep, as JSON."""
    return (
        json.dumps(chat)[:-1].encode() + b', "extra": ' + b"[" * depth + b"1" + b"]" * depth + b"}"
    )


@pytest.mark.parametrize("stream", [False, True])
async def test_a_body_nested_too_deep_is_400_at_the_door(
    relay_client: httpx.AsyncClient, stream: bool
) -> None:
    """Nested ~1000 deep it failed the backend's parser (a 5xx on every backend), and past
    254 the gateway's own writer (a plain-text 500 for a stream)."""
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    headers = {"content-type": "application/json"}
    for depth in (70, 300, 1000):
        body = nested(chat, depth)
        deep = await relay_client.post("/v1/chat/completions", content=body, headers=headers)
        assert_envelope(deep, 400)
        assert "nested more than 64 levels" in deep.json()["error"]["message"]
    # The body is level 1 and the list under it level 2: 63 more lists make 64 levels.
    body = nested(chat, 63)
    fine = await relay_client.post("/v1/chat/completions", content=body, headers=headers)
    # Past the door: the unreachable backend's 502, or 503 once the prober marked it down.
    assert fine.status_code in (502, 503), fine.text
