"""A drafter trial against real simulators: two p-eagle servers at K=7, one running the old
drafter, one the new (simulated by a workload its drafts match better: the simulator's
`code` profile accepts 3.94 tokens per step at K=7, `mixed` 3.38). The policy sends 30% of
p-eagle's requests to the new drafter, audited; each record says its drafter; the savings
report puts the two side by side with their acceptance intervals; each drafter gets a curve
of its own windows, and its requests are priced on it."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.conftest import (
    ADMIN,
    SIM_MODEL,
    ModuleGatewayStarter,
    ModuleServerStarter,
    Server,
    fleet_backend,
    price_gpu,
    sim_args,
    until,
)

SHARE, REQUESTS = 0.3, 240
TRIAL = {"drafter": "org/p-eagle-v2", "share": SHARE}
SIM = ("--method", "p-eagle", "--k", "7", "--per-request-spec-metrics", "--time-scale", "20")
# Windows of 1.5 s hold a few requests each: the gate is lowered to store them.
SETTINGS = {"COLLECT_INTERVAL_S": "0.3", "MEASUREMENT_WINDOW_S": "1.5", "REGISTRY_REFRESH_S": "0.5",
            "MEASUREMENT_MIN_REQUESTS": "1", "MEASUREMENT_MIN_OUTPUT_TOKENS": "1"}  # fmt: skip


@pytest.fixture(scope="module")
def gateway(
    start_module_servers: ModuleServerStarter, start_module_gateway: ModuleGatewayStarter
) -> Server:
    old, new = start_module_servers(
        sim_args(*SIM, "--workload", "mixed"), sim_args(*SIM, "--workload", "code")
    )
    backends = [
        fleet_backend("pe-old", old.base_url, "p-eagle"),  # amazon/GPT-OSS-20B-P-EAGLE
        fleet_backend("pe-new", new.base_url, "p-eagle", drafter=TRIAL["drafter"]),
    ]
    server, _ = start_module_gateway(backends, **SETTINGS)
    price_gpu(server, ["p-eagle"])
    return server


def _ask(gateway: Server) -> tuple[str, str]:
    """One request; (its id, the backend that served it)."""
    request_id = str(uuid.uuid4())
    client = openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key="none", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model=SIM_MODEL,
        messages=[{"role": "user", "content": f"task {request_id}"}],
        max_tokens=48,
        extra_headers={"x-request-id": request_id},
    )
    return request_id, raw.headers["x-draftgate-backend"]


def _get(gateway: Server, path: str, **params: Any) -> Any:
    response = httpx.get(f"{gateway.base_url}{path}", params=params, headers=ADMIN)
    response.raise_for_status()
    return response.json()


def _drafter_lines(gateway: Server) -> dict[str, Any]:
    curves = _get(gateway, "/admin/v1/curves", model=SIM_MODEL)["curves"]
    [curve] = [c for c in curves if c["method"] == "p-eagle"]
    return {d["drafter"]: d for d in curve["drafters"]}


def test_a_drafter_trial_splits_by_share_and_reports_both_drafters(gateway: Server) -> None:
    policy = {"mode": "pinned", "method": "p-eagle", "drafter_trial": TRIAL}
    put = httpx.put(
        f"{gateway.base_url}/admin/v1/models/{SIM_MODEL}/policy", json=policy, headers=ADMIN
    )
    assert put.status_code == 200, put.text
    audit = _get(gateway, "/admin/v1/audit", resource_type="model", resource_id=SIM_MODEL)
    assert audit["data"][0]["after"]["policy"]["drafter_trial"] == TRIAL
    until(lambda: _get(gateway, f"/admin/v1/models/{SIM_MODEL}")["policy"]["drafter_trial"],
          "the policy stored")  # fmt: skip
    with ThreadPoolExecutor(8) as pool:
        served = list(pool.map(lambda _: _ask(gateway), range(REQUESTS)))
    share = sum(backend == "pe-new" for _, backend in served) / REQUESTS
    print(f"\ntrial share {SHARE}: {share:.3f} of {REQUESTS} requests to the new drafter")
    assert abs(share - SHARE) < 0.12  # 4 standard errors of a binomial share

    def reported() -> dict[str | None, Any]:
        rows = _get(gateway, "/admin/v1/savings", group_by="drafter")["data"]
        by_drafter = {r["drafter"]: r for r in rows}
        return by_drafter if sum(r["requests"] for r in rows) >= REQUESTS else {}

    rows = until(reported, "every request's record")
    old, new = rows["amazon/GPT-OSS-20B-P-EAGLE"], rows[TRIAL["drafter"]]
    print(f"acceptance: old {old['acceptance_length']:.2f} {old['acceptance_length_95']}, "
          f"new {new['acceptance_length']:.2f} {new['acceptance_length_95']}")  # fmt: skip
    assert new["requests"] == sum(backend == "pe-new" for _, backend in served)
    assert old["acceptance_length_95"][1] < new["acceptance_length_95"][0]  # beyond doubt

    # each drafter's own windows draw a curve of its own, and its requests are priced on it
    lines = until(lambda: len(_drafter_lines(gateway)) == 2 and _drafter_lines(gateway),
                  "a curve per drafter")  # fmt: skip
    assert all(line["measured"] for line in lines.values())
    for drafter, line in sorted(lines.items()):
        points = [(p["concurrency"], p["usd_per_mtok"], p["source"]) for p in line["line"][:4]]
        print(f"{drafter}: measured at {[p['concurrency'] for p in line['measured']]}; {points}")

    def priced() -> list[dict[str, Any]]:
        request_id, _ = _ask(gateway)
        records = _get(gateway, "/admin/v1/usage", limit=1000)["data"]
        mine = [r for r in records if r["client_request_id"] == request_id]
        return mine if mine and mine[0]["drafter_factor"] is not None else []

    [record] = until(priced, "a request priced on its drafter's curve")
    assert record["drafter"] in lines
    assert record["cost_error_usd"] > 0
    assert record["usd_per_mtok"] > 0
