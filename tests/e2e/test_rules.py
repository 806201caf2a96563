"""Policy rules end to end: a gateway pinned to P-EAGLE sends structured-output requests to
plain by rule (declared in fleet.yaml), says which rule matched and counts it, while the rest
of the traffic stays on P-EAGLE; a class header and a long prompt pick rules too. The official
openai client talks to a real gateway in front of two simulators."""

from __future__ import annotations

import time
from collections import Counter

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

CHAT = [{"role": "user", "content": "Give me a JSON object."}]
POLICY = {
    "mode": "pinned",
    "method": "p-eagle",
    "rules": [
        {"when": ["structured_output"], "method": "plain"},
        {"when": ["class:batch"], "method": "plain"},
        {"when": ["prompt_tokens_above:2000"], "method": "plain"},
    ],
}
REQUESTS = 12


@pytest.fixture(scope="module")
def gateway(
    start_module_servers: ModuleServerStarter, start_module_gateway: ModuleGatewayStarter
) -> Server:
    plain, peagle = start_module_servers(
        sim_args("--time-scale", "50"),
        sim_args("--method", "p-eagle", "--k", "7", "--time-scale", "50"),
    )
    backends = [
        fleet_backend("sim-plain", plain.base_url),
        fleet_backend("sim-p-eagle", peagle.base_url, "p-eagle"),
    ]
    server, _ = start_module_gateway(backends, models=[{"name": SIM_MODEL, "policy": POLICY}])
    return server


def _client(gateway: Server, **headers: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{gateway.base_url}/v1", api_key="unused", max_retries=0,
        default_headers=headers,
    )  # fmt: skip


def test_structured_output_goes_to_plain_by_rule_and_the_rest_stays(gateway: Server) -> None:
    served: Counter[tuple[str, str | None]] = Counter()
    before = metric_value(gateway.base_url, "draftgate_rule_matches_total", rule="0")
    with _client(gateway) as client:
        for i in range(REQUESTS):
            structured = i % 2 == 0
            extra = {"response_format": {"type": "json_object"}} if structured else {}
            raw = client.chat.completions.with_raw_response.create(
                model=SIM_MODEL, messages=CHAT, max_tokens=8, **extra
            )
            assert raw.parse().choices[0].message.content is not None
            served[(raw.headers["x-draftgate-method"], raw.headers.get("x-draftgate-rule"))] += 1
    assert served == {("plain", "0"): REQUESTS // 2, ("p-eagle", None): REQUESTS // 2}
    after = metric_value(gateway.base_url, "draftgate_rule_matches_total", rule="0")
    assert after - before == REQUESTS // 2


def test_a_streamed_structured_request_follows_the_rule_too(gateway: Server) -> None:
    body = {
        "model": SIM_MODEL, "messages": CHAT, "max_tokens": 8, "stream": True,
        "response_format": {"type": "json_schema", "json_schema": {"name": "o", "schema": {}}},
    }  # fmt: skip
    url = f"{gateway.base_url}/v1/chat/completions"
    with httpx.stream("POST", url, json=body, timeout=30) as response:
        text = response.read().decode()
    assert response.status_code == 200, text
    assert text.rstrip().endswith("data: [DONE]")
    assert (response.headers["x-draftgate-method"], response.headers["x-draftgate-rule"]) == (
        "plain",
        "0",
    )


def test_a_class_header_picks_its_rule(gateway: Server) -> None:
    with _client(gateway, **{"x-draftgate-class": "batch"}) as batch:
        raw = batch.chat.completions.with_raw_response.create(
            model=SIM_MODEL, messages=CHAT, max_tokens=8
        )
    assert (raw.headers["x-draftgate-method"], raw.headers["x-draftgate-rule"]) == ("plain", "1")
    with _client(gateway, **{"x-draftgate-class": "interactive"}) as interactive:
        raw = interactive.chat.completions.with_raw_response.create(
            model=SIM_MODEL, messages=CHAT, max_tokens=8
        )
    assert raw.headers["x-draftgate-method"] == "p-eagle"
    assert "x-draftgate-rule" not in raw.headers


def test_a_long_prompt_picks_its_rule_and_the_record_names_it(gateway: Server) -> None:
    long = [{"role": "user", "content": "lighthouse " * 1000}]  # 11 kB: about 2,750 tokens
    with _client(gateway, **{"x-request-id": "long-prompt"}) as client:
        raw = client.chat.completions.with_raw_response.create(
            model=SIM_MODEL, messages=long, max_tokens=8
        )
        short = client.chat.completions.with_raw_response.create(
            model=SIM_MODEL, messages=CHAT, max_tokens=8
        )
    assert (raw.headers["x-draftgate-method"], raw.headers["x-draftgate-rule"]) == ("plain", "2")
    assert short.headers["x-draftgate-method"] == "p-eagle"
    assert "x-draftgate-rule" not in short.headers
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        page = httpx.get(f"{gateway.base_url}/admin/v1/usage", params={"rule": 2}, headers=admin)
        found = [r for r in page.json()["data"] if r["client_request_id"] == "long-prompt"]
        if found:
            break
        time.sleep(0.1)
    else:
        pytest.fail("no usage record of the long prompt under rule 2")
    assert (found[0]["rule"], found[0]["request_class"], found[0]["method"]) == (
        2,
        "interactive",
        "plain",
    )
