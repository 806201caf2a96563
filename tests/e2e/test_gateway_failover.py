"""Failover end to end: backends that are down, failing or cut mid-stream, behind a gateway."""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import openai
import pytest

from tests.e2e.conftest import (
    ADMIN_TOKEN,
    SIM_MODEL,
    ModuleGatewayStarter,
    ModuleServerStarter,
    Server,
    closed_url,
    fleet_backend,
    metric_value,
    sim_args,
    wait_for_metric,
    wait_for_usage_records,
)

ERRORS_MODEL = "failover/errors"  # two sims; one starts failing at run time
DROP_MODEL = "failover/drop"  # one sim that cuts every stream mid-way
DEAD_MODEL = "failover/dead"  # only backends where nothing listens
POISON_MODEL = "failover/poison"  # two sims that fail any prompt with a marker in it
BREAKER_FAILURES = 3
CHAT = [{"role": "user", "content": "Are you there?"}]
ASKED = itertools.count()  # each chat a conversation of its own: its own affinity key
POLICY_PATH = f"/admin/v1/models/{SIM_MODEL}/policy"
PROBE_TIMEOUT_S = 5.0
PIN_TIMEOUT_S = 15.0  # a pinned policy applies at the next registry refresh; busy machine


@dataclass
class Fleet:
    """The module's gateway and the sims behind it."""

    gateway: Server
    database_url: str
    ok: Server
    errors_good: Server
    errors_bad: Server
    poisoned: tuple[Server, Server]


def fast_sim(model: str, *options: str) -> tuple[str, ...]:
    """A fast plain sim serving `model`."""
    return sim_args("--time-scale", "50", "--served-model-name", model, *options)


@pytest.fixture(scope="module")
def fleet(
    start_module_servers: ModuleServerStarter, start_module_gateway: ModuleGatewayStarter
) -> Fleet:
    """SIM_MODEL: a down plain backend, a healthy one and a down p-eagle one; ERRORS_MODEL:
    two healthy sims; DROP_MODEL: one sim that drops streams; DEAD_MODEL: two down ones."""
    ok, good, bad, drop, poison_1, poison_2 = start_module_servers(
        fast_sim(SIM_MODEL),
        fast_sim(ERRORS_MODEL),
        fast_sim(ERRORS_MODEL),
        fast_sim(DROP_MODEL, "--drop-rate", "1"),
        fast_sim(POISON_MODEL),
        fast_sim(POISON_MODEL),
    )
    backends = [
        fleet_backend("a-down", closed_url()),
        fleet_backend("a-ok", ok.base_url),
        fleet_backend("a-peagle-down", closed_url(), "p-eagle"),
        fleet_backend("b-good", good.base_url, model=ERRORS_MODEL),
        fleet_backend("b-bad", bad.base_url, model=ERRORS_MODEL),
        fleet_backend("c-drop", drop.base_url, model=DROP_MODEL),
        fleet_backend("d-dead-1", closed_url(), model=DEAD_MODEL),
        fleet_backend("d-dead-2", closed_url(), model=DEAD_MODEL),
        fleet_backend("e-1", poison_1.base_url, model=POISON_MODEL),
        fleet_backend("e-2", poison_2.base_url, model=POISON_MODEL),
    ]
    gateway, database_url = start_module_gateway(
        backends, BREAKER_FAILURES=str(BREAKER_FAILURES), BREAKER_COOLDOWN_S="120"
    )
    return Fleet(gateway, database_url, ok, good, bad, (poison_1, poison_2))


@pytest.fixture
def client(fleet: Fleet) -> Iterator[openai.OpenAI]:
    """The official client pointed at the gateway (no client-side retries)."""
    base_url = f"{fleet.gateway.base_url}/v1"
    with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0) as llm:
        yield llm


def wait_marked_down(fleet: Fleet, *backends: str) -> None:
    """Until the gateway's prober has marked `backends` unhealthy."""
    for name in backends:
        gateway = fleet.gateway.base_url
        wait_for_metric(gateway, "draftgate_backend_healthy", 0, PROBE_TIMEOUT_S, backend=name)


def chat_headers(client: openai.OpenAI, model: str = SIM_MODEL) -> httpx.Headers:
    """The response headers of one successful short chat, a new conversation each time (so
    keys spread over the backends as many clients' would)."""
    messages = [{"role": "user", "content": f"Are you there? ({next(ASKED)})"}]
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=messages, max_tokens=3
    )
    assert raw.parse().choices[0].message.content
    return raw.headers


def test_a_down_backend_never_fails_a_request(client: openai.OpenAI) -> None:
    for i in range(10):
        if i % 2:
            assert chat_headers(client)["x-draftgate-backend"] == "a-ok"
            continue
        with client.chat.completions.with_streaming_response.create(
            model=SIM_MODEL, messages=CHAT, max_tokens=5, stream=True
        ) as response:
            assert response.headers["x-draftgate-backend"] == "a-ok"
            chunks = list(response.parse())
        assert chunks[-1].choices[0].finish_reason == "length"


def retries(fleet: Fleet) -> float:
    """Requests of ERRORS_MODEL retried on another backend so far."""
    name = "draftgate_upstream_retries_total"
    return metric_value(fleet.gateway.base_url, name, model=ERRORS_MODEL)


def test_a_failing_backend_is_retried_around_then_skipped(
    fleet: Fleet, client: openai.OpenAI
) -> None:
    with httpx.Client(base_url=fleet.errors_bad.base_url) as sim:
        assert sim.post("/sim/faults", json={"error_rate": 1}).status_code == 200
        try:
            for _ in range(60):  # each request tries b-bad first half of the time
                assert chat_headers(client, ERRORS_MODEL)["x-draftgate-backend"] == "b-good"
                if retries(fleet) >= BREAKER_FAILURES:
                    break
            assert retries(fleet) == BREAKER_FAILURES  # one per failure, until the breaker
            for _ in range(10):
                assert chat_headers(client, ERRORS_MODEL)["x-draftgate-backend"] == "b-good"
            assert retries(fleet) == BREAKER_FAILURES  # the open breaker keeps b-bad out
            wait_marked_down(fleet, "b-bad")  # as /metrics tells it
        finally:
            assert sim.post("/sim/faults", json={"error_rate": 0}).status_code == 200


def test_a_poison_request_is_not_held_against_the_backends(
    fleet: Fleet, client: openai.OpenAI
) -> None:
    """A request every backend fails (a prompt that crashes the engine) is the request's
    fault: after the second backend fails it alike it is answered, not retried further, and
    no breaker counts it, so ten of them (3 failures open a breaker here) leave both
    backends serving without panic routing."""
    marker = f"poison-{uuid.uuid4().hex[:8]}"
    gateway = fleet.gateway.base_url
    for sim in fleet.poisoned:
        assert httpx.post(f"{sim.base_url}/sim/faults", json={"poison": marker}).status_code == 200
    try:
        for _ in range(10):
            with pytest.raises(openai.APIStatusError) as raised:
                client.chat.completions.create(
                    model=POISON_MODEL, messages=[{"role": "user", "content": marker}]
                )
            assert raised.value.status_code == 502
            assert isinstance(raised.value.body, dict)
            assert raised.value.body["code"] == "request_failed_on_backends"
        assert metric_value(gateway, "draftgate_poison_requests_total", model=POISON_MODEL) == 10
        retried = metric_value(gateway, "draftgate_upstream_retries_total", model=POISON_MODEL)
        assert retried == 10  # each tried on exactly one other backend
        served = {chat_headers(client, POISON_MODEL)["x-draftgate-backend"] for _ in range(20)}
        assert served == {"e-1", "e-2"}
        panics = metric_value(gateway, "draftgate_panic_routes_total", model=POISON_MODEL)
        assert panics == 0  # no breaker opened
        with fleet.gateway.client() as http:
            assert http.get("/ready").status_code == 200
    finally:
        for sim in fleet.poisoned:
            httpx.post(f"{sim.base_url}/sim/faults", json={"poison": ""})


def test_a_stream_cut_mid_way_ends_with_an_error_event(fleet: Fleet, client: openai.OpenAI) -> None:
    rid = f"cut-{uuid.uuid4().hex[:8]}"
    received = []
    stream = client.chat.completions.create(
        model=DROP_MODEL,
        messages=CHAT,
        max_tokens=100,
        stream=True,
        extra_body={"ignore_eos": True},
        extra_headers={"x-request-id": rid},
    )
    with pytest.raises(openai.APIError) as raised:
        received.extend(stream)
    assert any(c.choices and c.choices[0].delta.content for c in received)  # cut mid-way
    assert isinstance(raised.value.body, dict)
    assert raised.value.body["code"] == "stream_interrupted"
    assert raised.value.body["request_id"] == rid
    record = wait_for_usage_records(fleet.database_url, [rid])[rid]
    assert (record["status_code"], record["outcome"]) == (502, "upstream_error")
    assert record["backend_name"] == "c-drop"


def test_no_healthy_backend_is_503_with_retry_after(fleet: Fleet) -> None:
    wait_marked_down(fleet, "d-dead-1", "d-dead-2")
    body = {"model": DEAD_MODEL, "messages": CHAT}
    with fleet.gateway.client() as http:
        response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 503, response.text
    assert int(response.headers["retry-after"]) > 0
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == "no_healthy_backend"
    assert DEAD_MODEL in error["message"]
    assert "backend unreachable" in error["message"]  # both were tried all the same (panic)
    panics = metric_value(fleet.gateway.base_url, "draftgate_panic_routes_total", model=DEAD_MODEL)
    assert panics >= 1


def test_an_unknown_model_is_404_model_not_found(fleet: Fleet, client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as raised:
        client.chat.completions.create(model="no-such/model", messages=CHAT)
    assert raised.value.status_code == 404
    assert isinstance(raised.value.body, dict)
    assert raised.value.body["code"] == "model_not_found"
    assert raised.value.body["param"] == "model"
    # Metric labels come from the registry, never from what a client sends.
    assert "no-such/model" not in httpx.get(f"{fleet.gateway.base_url}/metrics").text


def test_a_pinned_method_without_healthy_backend_falls_back(
    fleet: Fleet, client: openai.OpenAI
) -> None:
    wait_marked_down(fleet, "a-peagle-down")
    with fleet.gateway.client(ADMIN_TOKEN) as admin:
        pinned = admin.put(POLICY_PATH, json={"mode": "pinned", "method": "p-eagle", "k": 7})
        assert pinned.status_code == 200, pinned.text
        try:
            deadline = time.monotonic() + PIN_TIMEOUT_S
            while "x-draftgate-fallback" not in (headers := chat_headers(client)):
                assert time.monotonic() < deadline, "the pinned policy did not apply in time"
                time.sleep(0.05)
        finally:
            assert admin.put(POLICY_PATH, json={"mode": "auto"}).status_code == 200
    assert headers["x-draftgate-backend"] == "a-ok"
    assert headers["x-draftgate-method"] == "plain"
    assert headers["x-draftgate-fallback"] == "no_healthy_backend"
    labels = {"model": SIM_MODEL, "reason": "no_healthy_backend"}
    assert metric_value(fleet.gateway.base_url, "draftgate_fallbacks_total", **labels) >= 1


def test_ready_while_some_backends_are_down(fleet: Fleet) -> None:
    wait_marked_down(fleet, "a-down")
    with fleet.gateway.client() as http:
        response = http.get("/ready")
    assert response.status_code == 200, response.text
    assert response.json()["backends_healthy"] >= 2
