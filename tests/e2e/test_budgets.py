"""Limits that hold under concurrency: a request's worst case is reserved at admission and
settled at its end, so concurrent requests cannot overrun a budget or a token limit together;
a model without a curve is charged by GPU time, never free. Through the real gateway and
simulators, with the official `openai` client."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.conftest import (
    ADMIN_TOKEN,
    SIM_MODEL,
    ModuleGatewayStarter,
    ModuleServerStarter,
    Server,
    fleet_backend,
    metric_value,
    sim_args,
)

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
PRIVATE_MODEL = "acme/private-chat"  # no planner spec, never measured: no curve prices it
WAIT_S = 60.0  # a deadline for the ledger's writes, not a wait
CONCURRENT = 20
BUDGET_REQUESTS = 3  # the budget: about this many requests' cost
MAX_TOKENS = 64  # about 0.3 s at the simulator's real speed: the 20 requests overlap
CHAT = [{"role": "user", "content": "Tell me about speculative decoding."}]


@dataclass
class Stack:
    gateway: Server
    sim: Server

    def key(self, **limits: Any) -> tuple[int, str]:
        created = httpx.post(
            f"{self.gateway.base_url}/admin/v1/keys", json={"name": "b", **limits}, headers=ADMIN
        )
        assert created.status_code == 201, created.text
        return created.json()["id"], created.json()["key"]

    def client(self, key: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.gateway.base_url}/v1", api_key=key, max_retries=0)

    def records(self, key_id: int, count: int, status: int = 200) -> list[dict[str, Any]]:
        """The key's records of requests that ended in `status`, once `count` are written."""
        found: list[dict[str, Any]] = []

        def written() -> bool:
            params: dict[str, str | int] = {"key": key_id, "limit": 1000}
            page = httpx.get(
                f"{self.gateway.base_url}/admin/v1/usage", params=params, headers=ADMIN
            )
            found[:] = [r for r in page.json()["data"] if r["status_code"] == status]
            return len(found) >= count

        _until(written, f"{count} usage records of key {key_id} were not written")
        return found


def _until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(what)
        time.sleep(0.1)


@pytest.fixture(scope="module")
def stack(
    start_module_servers: ModuleServerStarter, start_module_gateway: ModuleGatewayStarter
) -> Stack:
    sim, private = start_module_servers(
        sim_args("--time-scale", "1"),
        sim_args("--time-scale", "20", "--served-model-name", PRIVATE_MODEL),
    )
    gateway, _ = start_module_gateway(
        [
            fleet_backend("b-plain", sim.base_url),
            fleet_backend("b-private", private.base_url, model=PRIVATE_MODEL),
        ],
        REQUIRE_API_KEY="true",
    )
    price = {"gpu_type": "B200", "usd_per_gpu_hour": 6.0, "source": "test", "date": "2026-11-01"}
    created = httpx.post(f"{gateway.base_url}/admin/v1/prices", json=price, headers=ADMIN)
    assert created.status_code == 201, created.text
    return Stack(gateway, sim)


def _one_request_usd(stack: Stack) -> float:
    """What one request of the load below costs, from its record."""
    key_id, key = stack.key()
    with stack.client(key) as client:
        client.chat.completions.create(model=SIM_MODEL, messages=CHAT, max_tokens=MAX_TOKENS)  # type: ignore[arg-type]
    [record] = stack.records(key_id, 1)
    assert record["cost_usd"] > 0, "requests are not priced: the budget test would prove nothing"
    return float(record["cost_usd"])


def _send(client: openai.OpenAI, index: int) -> str:
    """One request, chat or the Responses API in turn; "ok" or the refusal's status and code."""
    try:
        if index % 2:
            client.responses.create(model=SIM_MODEL, input="Hello", max_output_tokens=MAX_TOKENS)
        else:
            client.chat.completions.create(
                model=SIM_MODEL,
                messages=CHAT,  # type: ignore[arg-type]
                max_tokens=MAX_TOKENS,
            )
    except openai.APIStatusError as refused:
        return f"{refused.status_code} {refused.code}"
    return "ok"


def test_concurrent_requests_overrun_a_budget_by_at_most_one_request(stack: Stack) -> None:
    per_request = _one_request_usd(stack)
    budget = BUDGET_REQUESTS * per_request
    key_id, key = stack.key(budget_usd=budget, budget_period="total")
    with stack.client(key) as client, ThreadPoolExecutor(CONCURRENT) as pool:
        statuses = list(pool.map(lambda i: _send(client, i), range(CONCURRENT)))
    served = statuses.count("ok")
    assert set(statuses) <= {"ok", "429 insufficient_quota"}
    records = stack.records(key_id, served)
    spent = sum(r["cost_usd"] or 0.0 for r in records)
    print(
        f"\n{CONCURRENT} concurrent requests, budget ${budget:.6f} (~{BUDGET_REQUESTS} "
        f"requests): served {served}, refused {CONCURRENT - served}, spent ${spent:.6f} "
        f"({spent / per_request:.2f} requests' worth)"
    )
    assert 1 <= served < CONCURRENT
    assert spent <= budget + per_request


def test_a_request_larger_than_the_token_limit_is_refused_before_any_backend(
    stack: Stack,
) -> None:
    _, key = stack.key(tokens_per_minute=200)
    served_before = metric_value(stack.sim.base_url, "vllm:request_success_total")
    body = {"model": SIM_MODEL, "messages": CHAT, "max_tokens": 500}
    headers = {"Authorization": f"Bearer {key}"}
    url = f"{stack.gateway.base_url}/v1/chat/completions"
    refused = httpx.post(url, json=body, headers=headers, timeout=30.0)
    assert refused.status_code == 429, refused.text
    error = refused.json()["error"]
    assert (error["code"], error["param"]) == ("rate_limit_exceeded", "max_tokens")
    assert "Request too large" in error["message"]
    assert "retry-after" not in refused.headers  # waiting never lets it through
    served = httpx.post(url, json={**body, "max_tokens": 8}, headers=headers, timeout=30.0)
    assert served.status_code == 200, served.text
    assert served.headers["x-ratelimit-limit-tokens"] == "200"
    # Its reservation (the prompt's estimate and 8 completion tokens) counts as used.
    assert 0 <= int(served.headers["x-ratelimit-remaining-tokens"]) < 200 - 8
    assert float(served.headers["x-draftgate-cost-usd"]) > 0
    assert served.headers["x-draftgate-cost-source"] in {"measured", "estimated"}
    assert metric_value(stack.sim.base_url, "vllm:request_success_total") == served_before + 1


def test_concurrent_requests_cannot_pass_a_token_limit_together(stack: Stack) -> None:
    limit = 400
    key_id, key = stack.key(tokens_per_minute=limit)
    first_minute = int(time.time() // 60)
    with stack.client(key) as client, ThreadPoolExecutor(CONCURRENT) as pool:
        outcomes = list(pool.map(lambda _: _chat_status(client), range(CONCURRENT)))
    minutes = int(time.time() // 60) - first_minute + 1  # a run may cross a clock minute
    records = stack.records(key_id, outcomes.count(200))
    used = sum(r["prompt_tokens"] + r["completion_tokens"] for r in records)
    print(f"\ntokens per minute {limit}: served {outcomes.count(200)}, used {used} tokens")
    assert 1 <= outcomes.count(200) < CONCURRENT
    assert used <= limit * minutes  # each clock minute's window holds the limit


def _chat_status(client: openai.OpenAI) -> int:
    try:
        client.chat.completions.create(model=SIM_MODEL, messages=CHAT, max_tokens=MAX_TOKENS)  # type: ignore[arg-type]
    except openai.RateLimitError as refused:
        return refused.status_code
    return 200


def test_a_model_without_a_curve_is_charged_by_gpu_time(stack: Stack) -> None:
    key_id, key = stack.key()
    before = metric_value(
        stack.gateway.base_url, "draftgate_unpriced_requests_total", reason="gpu_time"
    )
    rid = uuid.uuid4().hex
    with stack.client(key) as client:
        reply = client.chat.completions.create(
            model=PRIVATE_MODEL,
            messages=CHAT,  # type: ignore[arg-type]
            max_tokens=MAX_TOKENS,
            extra_headers={"x-request-id": rid},
        )
    assert reply.usage is not None
    assert reply.usage.completion_tokens > 0
    [record] = stack.records(key_id, 1)
    assert record["curve_source"] == "gpu_time"
    assert record["cost_usd"] > 0
    assert record["baseline_cost_usd"] == record["cost_usd"]  # no saving claimed
    assert record["cost_error_usd"] == record["cost_usd"]  # +-100%
    after = metric_value(
        stack.gateway.base_url, "draftgate_unpriced_requests_total", reason="gpu_time"
    )
    assert after == before + 1
    backends = httpx.get(f"{stack.gateway.base_url}/admin/v1/backends", headers=ADMIN).json()
    pricing = {b["name"]: b["runtime"]["pricing"] for b in backends["data"]}
    assert pricing == {"b-plain": "curve", "b-private": "gpu_time"}


def test_an_abandoned_whole_response_is_charged_what_its_backend_generated(
    stack: Stack,
) -> None:
    """A client that gives up on a non-streamed request: the backend never says what it
    generated, so the record carries the gateway's estimate (labelled), close to what the
    simulator counted, and is charged for it."""
    key_id, key = stack.key()
    before = metric_value(stack.sim.base_url, "vllm:generation_tokens_total")
    body = {"model": SIM_MODEL, "messages": CHAT, "max_tokens": 4000, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):  # gives up after a second, mid-generation
        httpx.post(
            f"{stack.gateway.base_url}/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {key}"},
            timeout=httpx.Timeout(30.0, read=1.0),
        )
    [record] = stack.records(key_id, 1, status=499)
    generated = metric_value(stack.sim.base_url, "vllm:generation_tokens_total") - before
    print(f"\nabandoned after 1 s: simulator generated {generated:.0f}, recorded {record}")
    assert record["outcome"] == "client_disconnect"
    assert record["tokens_estimated"] is True
    assert 0 < record["completion_tokens"] < 4000
    assert generated / 2 <= record["completion_tokens"] <= generated * 2
    assert record["cost_usd"] > 0
