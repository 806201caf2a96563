"""No free tokens: what a backend generates is charged, whatever the request's shape or fate.

A non-streamed request gets its response head only once generation ends, so one that outlasts
the read timeout was accepted and worked on: it is answered 504 after that one backend, never
retried on another, charged an estimate of what its backend generated, and it opens no
breaker. A list of prompts on `/v1/completions` is a completion per prompt: all of them are
reserved against the key's limits at admission and counted in its record. Through the real
gateway and simulators on sockets.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
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
READ_TIMEOUT_S = 3  # about 1,300 tokens of one stream at the simulator's real speed
WAIT_S = 60.0  # a deadline for records and counters, not a wait
CHAT = [{"role": "user", "content": "Write a very long story."}]


@dataclass
class Stack:
    gateway: Server
    sims: list[Server]

    def key(self, **limits: Any) -> tuple[int, str]:
        created = httpx.post(
            f"{self.gateway.base_url}/admin/v1/keys", json={"name": "t", **limits}, headers=ADMIN
        )
        assert created.status_code == 201, created.text
        return created.json()["id"], created.json()["key"]

    def post(self, path: str, key: str, body: dict[str, Any]) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"}
        return httpx.post(f"{self.gateway.base_url}{path}", json=body, headers=headers, timeout=60)

    def record(self, key_id: int) -> dict[str, Any]:
        """The key's one usage record, once written."""
        found: list[dict[str, Any]] = []

        def written() -> bool:
            params: dict[str, str | int] = {"key": key_id}
            page = httpx.get(
                f"{self.gateway.base_url}/admin/v1/usage", params=params, headers=ADMIN
            )
            found[:] = page.json()["data"]
            return bool(found)

        _until(written, f"no usage record of key {key_id} was written")
        [record] = found
        return record

    def sims_total(self, name: str, **labels: str) -> float:
        """A counter summed over every simulator."""
        return sum(metric_value(s.base_url, name, **labels) for s in self.sims)


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
    """Two simulators at real speed behind a gateway whose read timeout is short and whose
    breaker opens at the first failure (so a timeout counted as one would show)."""
    sims = start_module_servers(sim_args("--time-scale", "1"), sim_args("--time-scale", "1"))
    gateway, _ = start_module_gateway(
        [fleet_backend(f"b-{i}", sim.base_url) for i, sim in enumerate(sims)],
        REQUIRE_API_KEY="true",
        READ_TIMEOUT_S=str(READ_TIMEOUT_S),
        BREAKER_FAILURES="1",
        COLLECT_INTERVAL_S="3600",  # priced by the planner's curve, which the simulator runs
    )
    price = {"gpu_type": "B200", "usd_per_gpu_hour": 6.0, "source": "test", "date": "2026-11-01"}
    created = httpx.post(f"{gateway.base_url}/admin/v1/prices", json=price, headers=ADMIN)
    assert created.status_code == 201, created.text
    return Stack(gateway, sims)


def test_a_whole_response_past_the_read_timeout_is_answered_once_and_charged(
    stack: Stack,
) -> None:
    key_id, key = stack.key()
    requests_before = stack.sims_total("vllm:request_success_total")
    tokens_before = stack.sims_total("vllm:generation_tokens_total")
    body = {"model": SIM_MODEL, "messages": CHAT, "max_tokens": 30000, "ignore_eos": True}
    response = stack.post("/v1/chat/completions", key, body)
    assert response.status_code == 504, response.text
    assert response.json()["error"]["code"] == "timeout"
    # The simulator counts a request when it ends, an abandoned one too ("abort").
    _until(
        lambda: (
            stack.sims_total("vllm:request_success_total") > requests_before
            and stack.sims_total("vllm:num_requests_running") == 0
        ),
        "the simulators never ended the request",
    )
    reached = stack.sims_total("vllm:request_success_total") - requests_before
    generated = stack.sims_total("vllm:generation_tokens_total") - tokens_before
    record = stack.record(key_id)
    retried = metric_value(
        stack.gateway.base_url, "draftgate_upstream_retries_total", model=SIM_MODEL
    )
    backends = httpx.get(f"{stack.gateway.base_url}/admin/v1/backends", headers=ADMIN).json()
    opened = [b["name"] for b in backends["data"] if b["runtime"]["circuit_open"]]
    print(
        f"\nnon-streamed past a {READ_TIMEOUT_S} s read timeout: reached {reached:.0f} "
        f"backend(s), {retried:.0f} retries, breakers opened {opened}; simulators generated "
        f"{generated:.0f}, recorded {record['completion_tokens']} (estimated: "
        f"{record['tokens_estimated']}), ${record['cost_usd']}"
    )
    assert (reached, retried, opened) == (1, 0, [])
    assert (record["status_code"], record["tokens_estimated"]) == (504, True)
    assert abs(record["completion_tokens"] - generated) <= 0.1 * generated
    assert record["cost_usd"] > 0


def test_a_whole_list_past_the_read_timeout_is_charged_for_every_prompt(stack: Stack) -> None:
    """Four prompts generate side by side: the estimate counts four sequences at the load
    they make together, not one."""
    key_id, key = stack.key()
    tokens_before = stack.sims_total("vllm:generation_tokens_total")
    requests_before = stack.sims_total("vllm:request_success_total")
    prompts = [f"Tell story number {i}." for i in range(4)]
    body = {"model": SIM_MODEL, "prompt": prompts, "max_tokens": 30000, "ignore_eos": True}
    response = stack.post("/v1/completions", key, body)
    assert response.status_code == 504, response.text
    _until(
        lambda: (
            stack.sims_total("vllm:request_success_total") >= requests_before + len(prompts)
            and stack.sims_total("vllm:num_requests_running") == 0
        ),
        "the simulators never ended the prompts",
    )
    generated = stack.sims_total("vllm:generation_tokens_total") - tokens_before
    record = stack.record(key_id)
    print(
        f"\n{len(prompts)} prompts past the read timeout: simulators generated {generated:.0f}, "
        f"recorded {record['completion_tokens']} (estimated: {record['tokens_estimated']})"
    )
    assert stack.sims_total("vllm:request_success_total") == requests_before + len(prompts)
    assert record["tokens_estimated"] is True
    assert abs(record["completion_tokens"] - generated) <= 0.1 * generated


LIST_MAX_TOKENS = 50
TOKENS_PER_MINUTE = 300


def test_a_list_of_prompts_reserves_every_prompt(stack: Stack) -> None:
    """Six prompts of 50 tokens are more than a 300-token minute holds, one is not."""
    _, key = stack.key(tokens_per_minute=TOKENS_PER_MINUTE)
    served_before = stack.sims_total("vllm:request_success_total")
    prompts = [f"Prompt {i}" for i in range(6)]
    body = {"model": SIM_MODEL, "prompt": prompts, "max_tokens": LIST_MAX_TOKENS}
    refused = stack.post("/v1/completions", key, body | {"ignore_eos": True})
    assert refused.status_code == 429, refused.text
    assert "Request too large" in refused.json()["error"]["message"]
    assert stack.sims_total("vllm:request_success_total") == served_before  # none reached
    one = stack.post("/v1/completions", key, body | {"prompt": prompts[0], "ignore_eos": True})
    assert one.status_code == 200, one.text


def test_a_list_of_prompts_is_counted_whole(stack: Stack) -> None:
    key_id, key = stack.key(tokens_per_minute=TOKENS_PER_MINUTE)
    prompts = [f"Prompt {i}" for i in range(3)]
    body = {"model": SIM_MODEL, "prompt": prompts, "max_tokens": LIST_MAX_TOKENS}
    response = stack.post("/v1/completions", key, body | {"ignore_eos": True})
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    reserved = TOKENS_PER_MINUTE - int(response.headers["x-ratelimit-remaining-tokens"])
    record = stack.record(key_id)
    print(
        f"\n{len(prompts)} prompts x {LIST_MAX_TOKENS} tokens: {reserved} reserved, the backend "
        f"generated {usage['completion_tokens']}, recorded {record['completion_tokens']}"
    )
    assert usage["completion_tokens"] == len(prompts) * LIST_MAX_TOKENS
    assert reserved >= len(prompts) * LIST_MAX_TOKENS
    assert (record["prompt_tokens"], record["completion_tokens"]) == (
        usage["prompt_tokens"],
        usage["completion_tokens"],
    )
    assert record["tokens_estimated"] is False


def test_a_streamed_list_of_prompts_is_counted_whole(stack: Stack) -> None:
    key_id, key = stack.key(tokens_per_minute=TOKENS_PER_MINUTE)
    prompts = [f"Prompt {i}" for i in range(3)]
    body = {"model": SIM_MODEL, "prompt": prompts, "max_tokens": LIST_MAX_TOKENS}
    response = stack.post("/v1/completions", key, body | {"ignore_eos": True, "stream": True})
    assert response.status_code == 200, response.text
    assert response.text.endswith("data: [DONE]\n\n")
    record = stack.record(key_id)
    assert record["completion_tokens"] == len(prompts) * LIST_MAX_TOKENS
    assert record["prompt_tokens"] > 0
