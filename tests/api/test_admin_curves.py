"""GET /admin/v1/curves: the very curves that price requests, with what they rest on."""

from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI

from gateway.db.session import transaction
from gateway.db.tables import Measurement
from gateway.registry import BackendView
from planner import calibration, catalog
from planner.fit_measurements import Hardware, prefill_s_per_token

CATALOG_MODEL, GPU = "openai/gpt-oss-20b", "B200"
BACKEND = {"name": "g-eagle3", "url": "http://127.0.0.1:9", "model": CATALOG_MODEL,
           "method": "eagle3", "k": 3, "drafter": "d", "gpu_type": GPU}  # fmt: skip


def _window(c: float, tps: float, requests: int | None, k: int = 3, out: int = 256) -> Measurement:
    return Measurement(
        model=CATALOG_MODEL, method="eagle3", k=k, gpu_type=GPU, concurrency=c,
        output_tokens_per_s=tps, mean_acceptance_length=2.5, source="scrape",
        backend_name="g-eagle3", requests=requests, mean_output_tokens=out,
    )  # fmt: skip


async def test_the_curves_are_the_ones_that_price_requests(
    client: httpx.AsyncClient, app: FastAPI
) -> None:
    assert (await client.post("/admin/v1/backends", json=BACKEND)).status_code == 201
    price = {"gpu_type": GPU, "usd_per_gpu_hour": 6.0, "source": "t", "date": "2026-11-01"}
    assert (await client.post("/admin/v1/prices", json=price)).status_code == 201
    components = app.state.components
    with transaction(components.sessions) as session:
        session.add_all([_window(4.0, 1000.0 + i, 40) for i in range(4)])  # four steady windows
        session.add(_window(4.0, 400.0, 10, out=4))  # ten max_tokens=4 requests: another shape
        session.add(_window(4.0, 9000.0, 40))  # an outlier
        session.add(_window(4.0, 700.0, 40, k=1))  # the backend's earlier K
        session.add(_window(16.0, 3000.0, None))  # an old row: no sample recorded
    components.registry.load()

    response = await client.get("/admin/v1/curves", params={"model": CATALOG_MODEL})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["price_kind"] == "on-demand"
    by_method = {c["method"]: c for c in body["curves"]}
    assert set(by_method) == {"eagle3", "plain"}  # plain: the baseline, predicted
    eagle3 = by_method["eagle3"]
    assert (eagle3["k"], eagle3["gpu_type"]) == (3, GPU)
    assert eagle3["rejected"] == {"shape": 1, "outlier": 1}
    low, high = eagle3["measured"]
    assert (low["concurrency"], low["points"], low["requests"]) == (4.0, 4, 160)
    assert low["output_tokens_per_s"] == pytest.approx(1001.5)
    assert 0 < low["relative_interval_95"] < 0.01  # four windows within 0.3%
    assert (high["concurrency"], high["points"], high["relative_interval_95"]) == (16.0, 1, None)
    assert low["sources"] == ["scrape"]

    # The line holds the measured points and estimates elsewhere; its $/1M at a load is what
    # the registry charges a request of this backend at that load.
    line = {p["concurrency"]: p for p in eagle3["line"]}
    assert line[4.0]["source"] == line[16.0]["source"] == "measured"
    assert line[4.0]["output_tokens_per_s"] == pytest.approx(1001.5)
    assert {p["source"] for c, p in line.items() if c not in (4.0, 16.0)} == {"estimated"}
    view = BackendView("g-eagle3", "", CATALOG_MODEL, "eagle3", 3, GPU, 1)
    snapshot = components.registry.snapshot
    for c, point in line.items():
        assert point["usd_per_mtok"] == pytest.approx(
            snapshot.usd_per_mtok(CATALOG_MODEL, "eagle3", view, c)
        )
    assert eagle3["usd_per_gpu_hour"] == 6.0
    assert line[4.0]["usd_per_mtok"] == pytest.approx(6.0 / (1001.5 * 3600) * 1e6)
    # Every line point carries the curve's band: a measured point's own windows, a point of
    # one window the spread one window shows on this curve, an estimate the planner's error
    # (checked on the curve's two measured points, never below its calibration error).
    half = low["relative_interval_95"]
    assert line[4.0]["relative_95"] == pytest.approx(half)
    usd = line[4.0]["usd_per_mtok"]
    assert line[4.0]["usd_per_mtok_95"] == pytest.approx([usd * (1 - half), usd * (1 + half)])
    assert line[16.0]["relative_95"] == pytest.approx(1.96 * low["relative_spread"])
    estimated = eagle3["estimated_relative_95"]
    assert estimated >= 2.45 * 0.07
    for c, point in line.items():
        assert point["relative_95"] == pytest.approx(
            snapshot.relative_95(CATALOG_MODEL, "eagle3", GPU, c)
        )
        if c not in (4.0, 16.0):
            assert point["relative_95"] == estimated
    assert by_method["plain"]["estimated_relative_95"] == pytest.approx(2.45 * 0.20)  # unmeasured

    # Prompts: priced at the planner's prefill model, and taken out of the output price by
    # the prompt tokens per output token the line's traffic had (these windows do not say:
    # the planner's chat workload, 100 prompt tokens per 1200 output tokens).
    hardware = Hardware(catalog.model(CATALOG_MODEL), catalog.gpu(GPU), 1,
                        calibration.workloads()["chat"])  # fmt: skip
    s_per_token = prefill_s_per_token(hardware, calibration.engine_calibration(), 100)
    assert eagle3["prompt_usd_per_mtok"] == pytest.approx(s_per_token * 6.0 / 3600 * 1e6)
    assert eagle3["prompt_tokens_per_output_token"] == pytest.approx(100 / 1200)
    for point in eagle3["line"]:
        taken = eagle3["prompt_tokens_per_output_token"] * eagle3["prompt_usd_per_mtok"]
        assert point["output_usd_per_mtok"] == pytest.approx(point["usd_per_mtok"] - taken)

    only_h100 = await client.get("/admin/v1/curves", params={"gpu": "H100"})
    assert only_h100.json()["curves"] == []


async def test_the_interval_narrows_as_points_accumulate(
    client: httpx.AsyncClient, app: FastAPI
) -> None:
    assert (await client.post("/admin/v1/backends", json=BACKEND)).status_code == 201
    components = app.state.components

    async def interval_after(windows: int) -> float:
        with transaction(components.sessions) as session:
            session.add_all([_window(4.0, 1000.0 + 10 * (i % 2), 40) for i in range(windows)])
        components.registry.load()
        body = (await client.get("/admin/v1/curves", params={"model": CATALOG_MODEL})).json()
        [eagle3] = [c for c in body["curves"] if c["method"] == "eagle3"]
        [point] = eagle3["measured"]
        return float(point["relative_interval_95"])

    few = await interval_after(4)  # four windows alternating 1000 and 1010 tokens/s
    many = await interval_after(12)  # sixteen of the same
    assert many < few
    assert many == pytest.approx(few * (4 / 16) ** 0.5, rel=0.05)  # 1 / sqrt(points)
