"""GET /admin/v1/gpus (the planner's GPU catalog) and the acceptance in a backend's runtime."""

from __future__ import annotations

import httpx
from fastapi import FastAPI

from gateway.db.session import transaction
from gateway.db.tables import Measurement
from planner import catalog
from tests.api.test_admin_backends import EAGLE3, assert_envelope


async def test_gpus_list_the_catalog_with_its_default_prices(client: httpx.AsyncClient) -> None:
    response = await client.get("/admin/v1/gpus")
    assert response.status_code == 200, response.text
    listed = response.json()["data"]
    assert [g["name"] for g in listed] == list(catalog.gpus())  # file order, every entry
    b200 = next(g for g in listed if g["name"] == "B200")
    spec = catalog.gpu("B200")
    assert b200["memory_gb"] == spec.memory_gb
    assert b200["hbm_bandwidth_tb_s"] == spec.hbm_bandwidth_tb_s
    assert "HGX-B200" in b200["aliases"]
    on_demand = next(p for p in b200["default_prices"] if p["kind"] == "on-demand")
    shipped = catalog.default_price("B200", "on-demand")
    assert on_demand["usd_per_gpu_hour"] == shipped.usd_per_gpu_hour
    assert on_demand["date"] == shipped.date.isoformat()


async def test_gpus_need_the_admin_token(client: httpx.AsyncClient) -> None:
    response = await client.get("/admin/v1/gpus", headers={"Authorization": "Bearer wrong"})
    assert_envelope(response, 401)


def _measure(
    app: FastAPI, k: int, acceptance: float | None, per_position: list[float] | None
) -> None:
    with transaction(app.state.components.sessions) as session:
        session.add(
            Measurement(
                model=EAGLE3["model"],
                method="eagle3",
                k=k,
                gpu_type="B200",
                concurrency=4,
                output_tokens_per_s=500.0,
                mean_acceptance_length=acceptance,
                acceptance_per_position=per_position,
                source="scrape",
                backend_name=EAGLE3["name"],
            )
        )


async def _runtime(client: httpx.AsyncClient) -> dict[str, object]:
    listed = (await client.get("/admin/v1/backends")).json()["data"]
    one = (await client.get(f"/admin/v1/backends/{EAGLE3['name']}")).json()
    assert listed[0]["runtime"] == one["runtime"]
    runtime: dict[str, object] = one["runtime"]
    return runtime


async def test_runtime_acceptance_from_the_last_scrape_else_the_latest_measurement(
    client: httpx.AsyncClient, app: FastAPI
) -> None:
    assert (await client.post("/admin/v1/backends", json=EAGLE3)).status_code == 201
    state = app.state.components.registry.states[EAGLE3["name"]]  # seen by this replica
    runtime = await _runtime(client)
    assert runtime["acceptance_length"] is None  # no data yet: nothing made up
    assert runtime["acceptance_source"] is None

    _measure(app, EAGLE3["k"], 2.5, [0.8, 0.5, 0.2])
    _measure(app, EAGLE3["k"], 2.2, [0.7, 0.4, 0.1])  # the newest one counts
    _measure(app, 5, 3.9, [0.9] * 5)  # another K: not this backend's configuration now
    _measure(app, EAGLE3["k"], None, None)  # no acceptance in it: skipped
    runtime = await _runtime(client)
    assert runtime["acceptance_source"] == "measurement"
    assert runtime["acceptance_length"] == 2.2
    assert runtime["acceptance_per_position"] == [0.7, 0.4, 0.1]

    state.acceptance_length, state.acceptance_per_position = 2.8, (0.9, 0.6, 0.3)
    runtime = await _runtime(client)
    assert runtime["acceptance_source"] == "scrape"
    assert (runtime["acceptance_length"], runtime["acceptance_per_position"]) == (
        2.8,
        [0.9, 0.6, 0.3],
    )


async def test_plain_backends_carry_no_acceptance(client: httpx.AsyncClient, app: FastAPI) -> None:
    plain = {**EAGLE3, "method": "plain", "k": None, "drafter": None}
    assert (await client.post("/admin/v1/backends", json=plain)).status_code == 201
    state = app.state.components.registry.states[EAGLE3["name"]]  # seen by this replica
    assert state.acceptance_length is None
    _measure(app, 0, 2.0, [0.5])  # a stale row under another method never shows
    runtime = await _runtime(client)
    assert runtime["acceptance_length"] is None
    assert runtime["acceptance_per_position"] is None
