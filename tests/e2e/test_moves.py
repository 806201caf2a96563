"""Gradual method moves end to end: a real gateway in front of a plain and a P-EAGLE
simulator. Pinning P-EAGLE in place of plain moves half the traffic at once and the rest a
step later: meanwhile both pools serve and each session stays on its side; each step is in
the audit log; an admin's `?immediate=true` moves everything at once."""

from __future__ import annotations

import datetime as dt
import time
from collections import Counter
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

STEP_S = 8.0  # long enough to send a few dozen short requests inside the first step
SETTINGS = {"MOVE_STEP_SHARE": "0.5", "MOVE_STEP_S": str(STEP_S), "SELECTOR_INTERVAL_S": "0.3"}
POLICY = f"/admin/v1/models/{SIM_MODEL}/policy"


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
    server, _ = start_module_gateway(backends, **SETTINGS)
    return server


@pytest.fixture(scope="module")
def admin(gateway: Server) -> Iterator[httpx.Client]:
    with gateway.client(ADMIN_TOKEN) as client:
        yield client


def pin(admin: httpx.Client, method: str, **params: str) -> dict[str, object]:
    response = admin.put(POLICY, json={"mode": "pinned", "method": method}, params=params)
    assert response.status_code == 200, response.text
    return response.json()


def method_for(http: httpx.Client, session: str) -> str:
    body = {"model": SIM_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    response = http.post("/v1/chat/completions", json=body, headers={"x-session-id": session})
    assert response.status_code == 200, response.text
    return response.headers["x-draftgate-method"]


def test_a_gradual_move_leaves_both_pools_serving_until_it_ends(
    gateway: Server, admin: httpx.Client
) -> None:
    assert pin(admin, "plain", immediate="true")["move"] is None
    model = pin(admin, "p-eagle")
    move = model["move"]
    assert isinstance(move, dict)
    assert (move["source"], move["target"], move["target_share"]) == ("plain", "p-eagle", 0.5)
    started = dt.datetime.fromisoformat(str(move["started_at"])).timestamp()
    sessions = [f"s{i}" for i in range(24)]
    first: dict[str, str] = {}
    seen: Counter[str] = Counter()
    with httpx.Client(base_url=gateway.base_url, timeout=30.0) as http:
        for _ in range(2):  # each session twice, while the first step lasts
            for session in sessions:
                method = method_for(http, session)
                if time.time() < started + STEP_S:  # still the first step: judge it
                    assert first.setdefault(session, method) == method  # a session stays put
                    seen[method] += 1
        assert sum(seen.values()) >= 12, "too few requests inside the first step to judge it"
        assert set(seen) == {"plain", "p-eagle"}  # both pools serve during the move
        deadline = time.monotonic() + STEP_S + 30.0
        while admin.get(f"/admin/v1/models/{SIM_MODEL}").json()["move"] is not None:
            assert time.monotonic() < deadline, "the move did not end"
            time.sleep(0.2)
        assert {method_for(http, s) for s in sessions} == {"p-eagle"}
    steps = audited_steps(admin, 2)
    assert [(s["after"]["step"], s["after"]["target_share"]) for s in steps] == [(1, 0.5), (2, 1.0)]
    assert all(s["before"] == {"method": "plain"} and s["actor"] == "auto" for s in steps)


def audited_steps(admin: httpx.Client, count: int) -> list[dict[str, object]]:
    """The last `count` move steps of the model in the audit log, oldest first, once the
    selector has written them (it audits a step within a round of reaching it)."""
    deadline = time.monotonic() + 10.0
    while True:
        params = {"resource_type": "model", "resource_id": SIM_MODEL}
        entries = admin.get("/admin/v1/audit", params=params).json()["data"]
        steps = [e for e in entries if e["action"] == "move_step"][:count]
        if len(steps) == count or time.monotonic() > deadline:
            return steps[::-1]
        time.sleep(0.2)


def test_an_immediate_move_takes_all_traffic_at_once(gateway: Server, admin: httpx.Client) -> None:
    pin(admin, "p-eagle", immediate="true")
    assert pin(admin, "plain", immediate="true")["move"] is None
    with httpx.Client(base_url=gateway.base_url, timeout=30.0) as http:
        assert {method_for(http, f"t{i}") for i in range(12)} == {"plain"}
    entries = admin.get("/admin/v1/audit", params={"resource_id": SIM_MODEL}).json()["data"]
    update = next(e for e in entries if e["action"] == "update")
    assert "move" not in update["after"]  # audited as a move of everything at once
