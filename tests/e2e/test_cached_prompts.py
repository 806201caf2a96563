"""Prompt tokens read from the prefix cache pay no prefill, and a stream can say its cost.

A simulator with prefix caching and vLLM's `--enable-prompt-tokens-details` answers the same
long prompt twice: the second answer's usage says the tokens it found cached, its record holds
them, its cost is lower by exactly those tokens at the prompt price, and the savings report
sums that prefill as what the cache saved. A stream asked for its cost with
`x-draftgate-include-cost: true` ends with an SSE comment holding its record's cost, which the
official `openai` client skips; a stream not asked has none. Through the real gateway on SQLite
and PostgreSQL.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.conftest import (
    ADMIN_TOKEN,
    SIM_MODEL,
    ModuleServerStarter,
    Server,
    fleet_backend,
    gateway_env,
    sim_args,
    spawn_server,
    write_fleet,
)

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
WAIT_S = 60.0  # a deadline for the ledger's writes, not a wait
PROMPT_WORDS = 3000
INCLUDE_COST = {"x-draftgate-include-cost": "true"}
COST_COMMENT = ": x-draftgate-cost "


def _until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(what)
        time.sleep(0.1)


@pytest.fixture(scope="module")
def sim(start_module_servers: ModuleServerStarter) -> Server:
    """A plain simulator caching prompt blocks (vLLM's default) whose usage says the
    tokens it found cached."""
    [server] = start_module_servers(
        sim_args("--time-scale", "20", "--enable-prompt-tokens-details")
    )
    return server


@pytest.fixture
def gateway(sim: Server, database_url: str, tmp_path: Path) -> Iterator[Server]:
    """A gateway on a fresh database in front of `sim`, its B200 priced and its curve too."""
    fleet = write_fleet(tmp_path / "fleet.yaml", [fleet_backend("cached", sim.base_url)])
    server = spawn_server(("gateway",), gateway_env(database_url, fleet), tmp_path)
    try:
        server.wait_healthy()
        price = {"gpu_type": "B200", "usd_per_gpu_hour": 6.0, "source": "test",
                 "date": "2026-11-01"}  # fmt: skip
        created = httpx.post(f"{server.base_url}/admin/v1/prices", json=price, headers=ADMIN)
        assert created.status_code == 201, created.text
        _until(lambda: _priced(server), "the plain curve was not priced")
        yield server
    finally:
        server.close()
    assert "Traceback" not in server.output(), server.output()[-3000:]


def _priced(gateway: Server) -> bool:
    curves = httpx.get(
        f"{gateway.base_url}/admin/v1/curves", params={"model": SIM_MODEL}, headers=ADMIN
    ).json()["curves"]
    return any(p["usd_per_mtok"] for c in curves for p in c["line"])


def _records(gateway: Server, ids: list[str]) -> list[dict[str, Any]]:
    """The usage records of these client request ids, in their order, once all are written."""
    found: dict[str, dict[str, Any]] = {}

    def written() -> bool:
        page = httpx.get(
            f"{gateway.base_url}/admin/v1/usage", params={"limit": 1000}, headers=ADMIN
        )
        found.update({r["client_request_id"]: r for r in page.json()["data"]})
        return set(ids) <= found.keys()

    _until(written, f"usage records of {sorted(set(ids) - found.keys())} were not written")
    return [found[i] for i in ids]


def _long_prompt() -> list[dict[str, str]]:
    """A prompt no earlier request shares a block of: a fresh word leads it."""
    words = [uuid.uuid4().hex, *(f"w{i % 97}" for i in range(PROMPT_WORDS))]
    return [{"role": "user", "content": " ".join(words)}]


class Recording(httpx.HTTPTransport):
    """The `openai` client's own transport, keeping each response's bytes as it reads them."""

    def __init__(self) -> None:
        super().__init__()
        self.bodies: list[bytearray] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        kept = bytearray()
        self.bodies.append(kept)
        stream = _Kept(response.stream, kept)  # type: ignore[arg-type]
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=stream,
            extensions=response.extensions,
        )


class _Kept(httpx.SyncByteStream):
    def __init__(self, stream: httpx.SyncByteStream, kept: bytearray) -> None:
        self._stream, self._kept = stream, kept

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._stream:
            self._kept += chunk
            yield chunk

    def close(self) -> None:
        self._stream.close()


def _client(gateway: Server, transport: httpx.BaseTransport | None = None) -> openai.OpenAI:
    http = httpx.Client(transport=transport or httpx.HTTPTransport(), timeout=60.0)
    return openai.OpenAI(
        base_url=f"{gateway.base_url}/v1", api_key="none", max_retries=0, http_client=http
    )


def test_a_cached_prompt_pays_no_prefill_and_the_savings_report_says_what_it_saved(
    gateway: Server,
) -> None:
    messages, ids, cached_seen = _long_prompt(), [], []
    with _client(gateway) as client:
        for _ in range(2):
            rid = uuid.uuid4().hex
            answer = client.chat.completions.create(
                model=SIM_MODEL, messages=messages, max_tokens=4,  # type: ignore[arg-type]
                extra_body={"ignore_eos": True}, extra_headers={"x-request-id": rid},
            )  # fmt: skip
            assert answer.usage is not None
            details = answer.usage.prompt_tokens_details
            cached_seen.append(None if details is None else details.cached_tokens)
            ids.append(rid)
    cold, warm = _records(gateway, ids)
    # vLLM's chat usage says cached tokens only when some were: the first found none.
    assert cached_seen[0] is None
    assert cold["cached_prompt_tokens"] is None
    assert warm["cached_prompt_tokens"] == cached_seen[1]
    prompt = warm["prompt_tokens"]
    assert cold["prompt_tokens"] == prompt > PROMPT_WORDS
    # Every full block of 16 tokens but the one holding the last token: vLLM computes it.
    assert warm["cached_prompt_tokens"] == (prompt - 1) // 16 * 16
    # The same load, the same prices: the cache took exactly its tokens' prefill off.
    price = warm["prompt_usd_per_mtok"]
    assert price > 0
    assert (cold["concurrency"], cold["prompt_usd_per_mtok"]) == (warm["concurrency"], price)
    assert cold["usd_per_mtok"] == pytest.approx(warm["usd_per_mtok"], rel=1e-9)
    skipped = warm["cached_prompt_tokens"] * price / 1e6
    assert cold["cost_usd"] - warm["cost_usd"] == pytest.approx(skipped, rel=1e-6)
    assert cold["baseline_cost_usd"] - warm["baseline_cost_usd"] == pytest.approx(skipped, rel=1e-6)
    for r in (cold, warm):  # the recipe of docs/costs.md, from the API alone
        uncached = r["prompt_tokens"] - (r["cached_prompt_tokens"] or 0)
        recomputed = (r["completion_tokens"] * r["usd_per_mtok"] + uncached * price) / 1e6
        assert r["cost_usd"] == pytest.approx(recomputed, rel=1e-9)
    [row] = httpx.get(
        f"{gateway.base_url}/admin/v1/savings", params={"group_by": "model"}, headers=ADMIN
    ).json()["data"]
    assert row["cached_prompt_tokens"] == warm["cached_prompt_tokens"]
    assert row["prefill_saved_by_cache_usd"] == pytest.approx(skipped, rel=1e-9)
    assert row["savings_usd"] == pytest.approx(0.0, abs=1e-15)  # plain saves nothing


def _cost_comments(body: bytes) -> list[dict[str, Any]]:
    lines = body.decode().split("\n")
    return [json.loads(line.removeprefix(COST_COMMENT)) for line in lines if line.startswith(":")]


def test_a_stream_says_its_cost_only_when_asked_and_the_openai_client_reads_it_alike(
    gateway: Server,
) -> None:
    """The cost comment goes last before [DONE], equal to the record; the cached tokens of
    a stream come from its usage-only chunk, which the client did not ask for."""
    messages, ids, recording = _long_prompt(), [], Recording()
    with _client(gateway, recording) as client:
        for headers in ({}, INCLUDE_COST, {}):
            rid = uuid.uuid4().hex
            stream = client.chat.completions.create(
                model=SIM_MODEL, messages=messages, max_tokens=8, stream=True,  # type: ignore[arg-type]
                extra_body={"ignore_eos": True}, extra_headers={"x-request-id": rid} | headers,
            )  # fmt: skip
            chunks = list(stream)
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            assert text
            assert all(c.choices for c in chunks)  # no usage-only chunk: not asked
            ids.append(rid)
    records = _records(gateway, ids)
    bodies = [bytes(b) for b in recording.bodies]
    assert len(bodies) == 3
    asked = bodies[1]
    [said] = _cost_comments(asked)
    assert asked.endswith(b"\n\ndata: [DONE]\n\n")
    assert asked.split(b"\n\n")[-3].startswith(COST_COMMENT.encode())  # the last before [DONE]
    record = records[1]
    assert record["cached_prompt_tokens"] == (record["prompt_tokens"] - 1) // 16 * 16
    assert said == {
        "cost_usd": record["cost_usd"],
        "cost_error_usd": record["cost_error_usd"],
        "curve_source": record["curve_source"],
    }
    assert said["cost_usd"] > 0
    for body in (bodies[0], bodies[2]):  # not asked: no comment at all
        assert _cost_comments(body) == []
        assert body.endswith(b"\n\ndata: [DONE]\n\n")
    # The stream after it hit the cache alike: the comment changed nothing the backend saw.
    assert records[2]["cached_prompt_tokens"] == record["cached_prompt_tokens"]
