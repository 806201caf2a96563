"""The collector against real simulators: measurements, routing load, method checks, and the
auto policy moving traffic to the cheapest measured method."""

from __future__ import annotations

import time

import httpx
import pytest

from backends.sim.config import SimConfig, acceptance_profile
from tests.e2e.conftest import (
    SIM_MODEL,
    ModuleGatewayStarter,
    ModuleServerStarter,
    Server,
    fleet_backend,
    metric_value,
    query_rows,
    sim_args,
)

CHAT = {
    "model": SIM_MODEL,
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 64,
    "ignore_eos": True,
}
WAIT_S = 30.0  # deadline of polls: windows close and scrapes land late on a busy machine
# Windows of 1.5 s hold a few requests each: the gate is lowered to store them (the gate
# itself is tested in tests/e2e/test_measurement_gates.py).
# The selector chooses every 0.5 s, and may correct a choice after 1 s.
SETTINGS = {"COLLECT_INTERVAL_S": "0.3", "MEASUREMENT_WINDOW_S": "1.5", "REGISTRY_REFRESH_S": "0.5",
            "MEASUREMENT_MIN_REQUESTS": "1", "MEASUREMENT_MIN_OUTPUT_TOKENS": "1",
            "SELECTOR_INTERVAL_S": "0.5", "SELECTOR_MIN_DWELL_S": "1"}  # fmt: skip


@pytest.fixture(scope="module")
def stack(
    start_module_servers: ModuleServerStarter, start_module_gateway: ModuleGatewayStarter
) -> tuple[Server, str]:
    fast = ("--time-scale", "10", "--workload", "chat")
    plain, peagle, liar = start_module_servers(
        sim_args(*fast), sim_args("--method", "p-eagle", "--k", "7", *fast), sim_args(*fast)
    )
    backends = [
        fleet_backend("sim-plain", plain.base_url),
        fleet_backend("sim-peagle", peagle.base_url, "p-eagle"),
        # A plain server declared as p-eagle: the collector must notice.
        fleet_backend("sim-liar", liar.base_url, "p-eagle", model="liar/model"),
    ]
    return start_module_gateway(backends, **SETTINGS)


def _traffic(server: Server, seconds: float) -> list[str]:
    methods = []
    deadline = time.monotonic() + seconds
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        while time.monotonic() < deadline:
            response = http.post("/v1/chat/completions", json=CHAT)
            assert response.status_code == 200, response.text
            methods.append(response.headers["x-draftgate-method"])
            http.post("/v1/chat/completions", json={**CHAT, "model": "liar/model"})
    return methods


def _measured_methods(server: Server) -> set[str]:
    admin = {"Authorization": "Bearer e2e-admin-token-0123456789abcdef"}
    curves = httpx.get(
        f"{server.base_url}/admin/v1/curves", params={"model": SIM_MODEL}, headers=admin
    ).json()["curves"]
    return {c["method"] for c in curves if c["measured"]}


def _routed(server: Server) -> str | None:
    admin = {"Authorization": "Bearer e2e-admin-token-0123456789abcdef"}
    fleet = httpx.get(
        f"{server.base_url}/admin/v1/fleet", params={"model": SIM_MODEL}, headers=admin
    ).json()
    routed: str | None = (fleet.get("now") or {}).get("routed_method")
    return routed


def test_scrapes_become_measurements_and_auto_moves_to_the_cheapest_method(
    stack: tuple[Server, str],
) -> None:
    server, database_url = stack
    admin = {"Authorization": "Bearer e2e-admin-token-0123456789abcdef"}
    explore = {"mode": "auto", "explore_fraction": 0.5}  # both methods get measured
    httpx.put(
        f"{server.base_url}/admin/v1/models/{SIM_MODEL}/policy", json=explore, headers=admin
    ).raise_for_status()
    price = {"gpu_type": "B200", "usd_per_gpu_hour": 6.0, "source": "test", "date": "2026-11-01"}
    httpx.post(f"{server.base_url}/admin/v1/prices", json=price, headers=admin)
    _traffic(server, 4.0)
    deadline = time.monotonic() + WAIT_S
    rows: list[dict[str, object]] = []
    while time.monotonic() < deadline:
        rows = query_rows(database_url, "SELECT * FROM measurements WHERE source = 'scrape'")
        if {r["method"] for r in rows if r["model"] == SIM_MODEL} >= {"plain", "p-eagle"}:
            break
        time.sleep(0.3)
    by_method = {r["method"]: r for r in rows if r["model"] == SIM_MODEL}
    assert set(by_method) >= {"plain", "p-eagle"}, rows
    assert by_method["plain"]["mean_acceptance_length"] is None
    profile = acceptance_profile(SimConfig(model=SIM_MODEL, method="p-eagle", k=7))
    assert profile is not None
    measured = float(by_method["p-eagle"]["mean_acceptance_length"])  # type: ignore[arg-type]
    assert measured == pytest.approx(profile.mean_acceptance_length(7), rel=0.15)
    assert float(by_method["p-eagle"]["output_tokens_per_s"]) > 0  # type: ignore[arg-type]

    httpx.put(
        f"{server.base_url}/admin/v1/models/{SIM_MODEL}/policy",
        json={"mode": "auto"},
        headers=admin,
    ).raise_for_status()
    # The registry has loaded both methods' measurements once its curves show them.
    deadline = time.monotonic() + WAIT_S
    while not _measured_methods(server) >= {"plain", "p-eagle"}:
        assert time.monotonic() < deadline, "the registry never loaded the measurements"
        time.sleep(0.2)
    # Routing serves the selector's audited choice: it prices the measured curves at its
    # next round and takes the cheaper.
    while _routed(server) != "p-eagle":
        assert time.monotonic() < deadline, f"the selector stayed on {_routed(server)}"
        time.sleep(0.2)
    methods = _traffic(server, 1.5)
    assert methods
    rows = query_rows(
        database_url, "SELECT method, concurrency, output_tokens_per_s FROM measurements"
    )
    assert set(methods) == {"p-eagle"}, (methods, rows)  # measured cheaper than plain


def test_declared_method_that_the_counters_contradict_is_flagged(
    stack: tuple[Server, str],
) -> None:
    server, _ = stack
    deadline = time.monotonic() + WAIT_S
    while (
        metric_value(server.base_url, "draftgate_backend_method_mismatch", backend="sim-liar") < 1
    ):
        assert time.monotonic() < deadline, "sim-liar was not flagged"
        time.sleep(0.2)
    assert (
        metric_value(server.base_url, "draftgate_backend_method_mismatch", backend="sim-peagle")
        == 0
    )
    admin = {"Authorization": "Bearer e2e-admin-token-0123456789abcdef"}
    liar = httpx.get(f"{server.base_url}/admin/v1/backends/sim-liar", headers=admin).json()
    assert liar["runtime"]["healthy"] is True
    assert "declared" in liar["runtime"]["method_mismatch"]
    listed = httpx.get(f"{server.base_url}/admin/v1/backends", headers=admin).json()["data"]
    honest = next(b for b in listed if b["name"] == "sim-peagle")
    assert honest["runtime"]["method_mismatch"] is None
    assert honest["runtime"]["in_flight"] >= 0
