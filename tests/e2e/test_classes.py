"""Request classes end to end: one auto model, two objectives. P-EAGLE runs on B200s priced
at $100/GPU-hour and plain on H100s at $1: P-EAGLE is the fastest per stream, plain the
cheapest per token. The policy gives `interactive` the latency objective and `batch` the
cost objective; the selector chooses per class, and the `x-draftgate-class` header (or the
key's class) decides which choice serves a request."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from tests.e2e.conftest import (
    ADMIN_TOKEN,
    SIM_MODEL,
    ModuleGatewayStarter,
    ModuleServerStarter,
    Server,
    fleet_backend,
    sim_args,
)

POLICY = {
    "mode": "auto",
    "classes": {"interactive": {"objective": "latency"}, "batch": {"objective": "cost"}},
}
PRICES = {"B200": 100.0, "H100": 1.0}


@pytest.fixture(scope="module")
def gateway(
    start_module_servers: ModuleServerStarter, start_module_gateway: ModuleGatewayStarter
) -> Server:
    plain, peagle = start_module_servers(
        sim_args("--gpu", "H100", "--time-scale", "50"),
        sim_args("--method", "p-eagle", "--k", "7", "--time-scale", "50"),
    )
    backends = [
        fleet_backend("sim-plain", plain.base_url, gpu_type="H100"),
        fleet_backend("sim-p-eagle", peagle.base_url, "p-eagle", gpu_type="B200"),
    ]
    models = [{"name": SIM_MODEL, "policy": POLICY}]
    server, _ = start_module_gateway(backends, models=models, SELECTOR_INTERVAL_S="0.3")
    with server.client(ADMIN_TOKEN) as admin:
        for gpu, usd in PRICES.items():
            price = {
                "gpu_type": gpu,
                "usd_per_gpu_hour": usd,
                "source": "test",
                "date": "2026-12-01",
            }
            assert admin.post("/admin/v1/prices", json=price).status_code == 201
    return server


@pytest.fixture(scope="module")
def http(gateway: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.base_url, timeout=30.0) as client:
        yield client


def method_of(http: httpx.Client, **headers: str) -> str:
    body = {"model": SIM_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    response = http.post("/v1/chat/completions", json=body, headers=headers)
    assert response.status_code == 200, response.text
    return response.headers["x-draftgate-method"]


def class_switches(gateway: Server) -> dict[str, dict[str, object]]:
    """The selector's latest audited choice per request class."""
    with gateway.client(ADMIN_TOKEN) as admin:
        params = {"resource_type": "model", "resource_id": SIM_MODEL}
        entries = admin.get("/admin/v1/audit", params=params).json()["data"]
    chosen: dict[str, dict[str, object]] = {}
    for entry in entries:  # newest first
        name = (entry["after"] or {}).get("request_class")
        if entry["action"] == "switch" and name and name not in chosen:
            chosen[name] = entry["after"]
    return chosen


def test_each_class_is_served_by_its_objectives_choice(gateway: Server, http: httpx.Client) -> None:
    deadline = time.monotonic() + 30.0
    while len(chosen := class_switches(gateway)) < 2:
        assert time.monotonic() < deadline, f"the selector chose for {sorted(chosen)} only"
        time.sleep(0.2)
    interactive, batch = chosen["interactive"], chosen["batch"]
    assert (interactive["method"], interactive["objective"]) == ("p-eagle", "latency")
    assert (batch["method"], batch["objective"]) == ("plain", "cost")
    itl, usd = interactive["itl_ms"], batch["usd_per_mtok"]
    assert isinstance(itl, dict)
    assert isinstance(usd, dict)
    assert itl["p-eagle"] < itl["plain"]  # why, audited: the fastest for latency
    assert usd["plain"] < usd["p-eagle"]  # and the cheapest for cost
    assert {method_of(http, **{"x-draftgate-class": "batch"}) for _ in range(5)} == {"plain"}
    assert {method_of(http, **{"x-draftgate-class": "interactive"}) for _ in range(5)} == {
        "p-eagle"
    }
    assert method_of(http) == "p-eagle"  # no header: the first class, interactive


def test_a_keys_class_serves_its_requests_whatever_their_header(
    gateway: Server, http: httpx.Client
) -> None:
    """The admin's class for a key holds: before, its header moved a `batch` key's requests
    to `interactive`, out from under the policy the admin meant for it."""
    with gateway.client(ADMIN_TOKEN) as admin:
        created = admin.post("/admin/v1/keys", json={"name": "nightly", "request_class": "batch"})
    assert created.status_code == 201, created.text
    assert created.json()["request_class"] == "batch"
    key = {"authorization": f"Bearer {created.json()['key']}"}
    assert method_of(http, **key) == "plain"
    assert method_of(http, **key, **{"x-draftgate-class": "interactive"}) == "plain"


def test_an_unknown_class_is_refused(http: httpx.Client) -> None:
    body = {"model": SIM_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    response = http.post("/v1/chat/completions", json=body, headers={"x-draftgate-class": "vip"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("unknown_request_class", "x-draftgate-class")
    assert "interactive, batch" in error["message"]
