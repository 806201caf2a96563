"""GET /admin/v1/fleet by hand: curves, an hourly traffic table and a price in; GPUs needed
per method, right-sized bills, achievable savings and over-provisioning out."""

from __future__ import annotations

import datetime as dt
import math

import httpx
import pytest
from fastapi import FastAPI

from gateway.accounting import write_batch
from gateway.db.session import transaction
from gateway.db.tables import AuditEntry, Measurement
from tests.api.test_admin_backends import assert_envelope
from tests.api.test_ledger import HOUR, entry
from tests.unit.test_rightsize import PLAIN, SPEC

HOURS_2 = dt.timedelta(hours=2)
MODEL = "m"  # not in the planner's catalog: its curves are its measurements alone
BACKENDS = [
    {"name": "m-plain", "url": "http://127.0.0.1:9", "model": MODEL, "method": "plain"},
    {"name": "m-eagle3", "url": "http://127.0.0.1:9", "model": MODEL, "method": "eagle3",
     "k": 3, "drafter": "d"},
]  # fmt: skip


def _measured(method: str, c: float, tps: float, requests: int | None = None) -> Measurement:
    return Measurement(
        requests=requests,
        model=MODEL,
        method=method,
        k=3 if method == "eagle3" else 0,
        gpu_type="H100",
        concurrency=c,
        output_tokens_per_s=tps,
        source="bench",
        mean_acceptance_length=None,
    )


async def _fleet(client: httpx.AsyncClient, app: FastAPI, spread: float = 0.0) -> None:
    """The fleet, its traffic and its curves: one window per point, or, with a spread, two
    windows of 10 requests each `spread` above and below every point."""
    for backend in BACKENDS:
        created = await client.post("/admin/v1/backends", json={**backend, "gpu_type": "H100"})
        assert created.status_code == 201, created.text
    price = {"gpu_type": "H100", "usd_per_gpu_hour": 3.0, "source": "t", "date": "2026-11-01"}
    assert (await client.post("/admin/v1/prices", json=price)).status_code == 201
    policy = {"mode": "pinned", "method": "eagle3", "itl_objective_ms": 25}
    assert (await client.put(f"/admin/v1/models/{MODEL}/policy", json=policy)).status_code == 200
    components = app.state.components
    with transaction(components.sessions) as session:
        for method, curve in (("plain", PLAIN), ("eagle3", SPEC)):
            for c, tps in zip(curve.concurrency, curve.output_tokens_per_s, strict=True):
                if spread:
                    session.add(_measured(method, c, tps * (1 + spread), requests=10))
                    session.add(_measured(method, c, tps * (1 - spread), requests=10))
                else:
                    session.add(_measured(method, c, tps))
        # An older backend of 16 GPUs held for the two hours: the bill.
        for at, action, after in (
            (HOUR, "create", {"model": MODEL, "method": "plain", "gpu_type": "H100",
                              "gpu_count": 16, "enabled": True}),
            (HOUR + dt.timedelta(hours=2), "delete", None),
        ):  # fmt: skip
            session.add(
                AuditEntry(at=at, actor="t", action=action, resource_type="backend",
                           resource_id="m-old", before=None, after=after)
            )  # fmt: skip
    # Hour 0: 100 output tokens/s, all plain. Hour 1: 3000 tokens/s, two thirds EAGLE-3.
    records = [
        entry(0, completion_tokens=360_000, method="plain", latency_ms=3_600_000.0),
        entry(1, minute=65, completion_tokens=3_600_000, method="plain", latency_ms=1.8e7),
        entry(2, minute=70, completion_tokens=7_200_000, method="eagle3", latency_ms=1.8e7),
    ]
    write_batch(components.sessions, [e for e in records])
    components.registry.load()  # the curves from the measurements just stored


async def test_right_sized_bills_savings_and_over_provisioning_by_hand(
    client: httpx.AsyncClient, app: FastAPI
) -> None:
    await _fleet(client, app)
    params = {
        "model": MODEL,
        "from": HOUR.isoformat(),
        "to": (HOUR + dt.timedelta(hours=2)).isoformat(),
    }
    response = await client.get("/admin/v1/fleet", params=params)
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["headroom"], body["min_replicas"]) == (0.2, 1)  # the defaults
    assert body["objective"] == {
        "itl_ms": 25.0,
        "sized_for": "itl objective",
        "speculation_pays_below_itl_ms": None,  # only asked without an objective
    }
    traffic = [(t["output_tokens_per_s"], t["mean_concurrency"]) for t in body["traffic"]]
    assert traffic == [(100.0, 1.0), (3000.0, 10.0)]  # busy seconds over 3600 s
    methods = {m["method"]: m for m in body["methods"]}
    # Within 25 ms per token a plain replica serves 320 tokens/s (8 streams), an EAGLE-3 one
    # 1333.3 (32 streams); with 20% headroom plain needs 1 and ceil(3600 / 320) = 12
    # replicas, EAGLE-3 1 and ceil(3600 / 1333.3) = 3: 13 and 4 GPU-hours at $3.
    plain, eagle3 = methods["plain"], methods["eagle3"]
    assert (plain["output_tokens_per_s_per_replica"], plain["peak_replicas"]) == (320, 12)
    assert eagle3["output_tokens_per_s_per_replica"] == pytest.approx(4000 / 3)
    assert eagle3["peak_replicas"] == 3
    assert (plain["gpu_hours"], plain["bill_usd"]) == (13, 39)
    assert (eagle3["gpu_hours"], eagle3["bill_usd"]) == (4, 12)
    assert plain["source"] == eagle3["source"] == "measured"  # 8 and 32 streams were measured
    assert body["best"] == "eagle3"
    assert body["achievable_savings_usd"] == 27
    # The bill: 16 GPUs for 2 hours. As served, hour 0 is one plain replica ($3) and hour 1
    # EAGLE-3's 2000 tokens/s on ceil(2400 / 1333.3) = 2 and plain's 1000 on
    # ceil(1200 / 320) = 4 replicas ($18): $21, so $96 - $21 is over-provisioning.
    assert body["actual"] == {"gpu_hours": 32.0, "spend_usd": 96.0}
    assert body["served_bill_usd"] == pytest.approx(21.0)
    assert body["over_provisioning_usd"] == pytest.approx(75.0)
    assert body["auto"]["bill_usd"] == 12  # EAGLE-3 is cheapest in both hours
    # The latency gain at the fleet one has: EAGLE-3 served hour 1 at 18000 busy seconds over
    # 3600 s on one backend, 5 streams: 540 + 260 * log2(5 / 4) = 623.7 tokens/s, 8.0 ms
    # per token, where plain's curve gives 180 + 140 * log2(5 / 4) = 225.1 tokens/s, 22.2 ms.
    latency = {row["method"]: row for row in body["latency"]}
    e3 = latency["eagle3"]
    assert (e3["output_tokens"], e3["concurrency_per_backend"]) == (7_200_000, 5.0)
    assert e3["itl_ms"] == pytest.approx(5000 / (540 + 260 * math.log2(1.25)))
    assert e3["plain_itl_ms"] == pytest.approx(5000 / (180 + 140 * math.log2(1.25)))
    assert e3["speedup_vs_plain"] == pytest.approx(e3["plain_itl_ms"] / e3["itl_ms"])
    assert latency["plain"]["speedup_vs_plain"] == 1
    assert body["now"] is None or set(body["now"]["desired_replicas"]) <= {"plain", "eagle3"}
    # One window per point, of a model the planner has no spec for: nothing bounds the
    # replica's throughput, so no bill claims an interval.
    assert plain["bill_usd_95"] is None
    assert body["achievable_savings_usd_95"] is None


async def test_bills_carry_the_interval_of_the_curves_they_rest_on(
    client: httpx.AsyncClient, app: FastAPI
) -> None:
    await _fleet(client, app, spread=0.02)
    params = {"model": MODEL, "from": HOUR.isoformat(), "to": (HOUR + HOURS_2).isoformat()}
    body = (await client.get("/admin/v1/fleet", params=params)).json()
    methods = {m["method"]: m for m in body["methods"]}
    plain, eagle3 = methods["plain"], methods["eagle3"]
    # Two windows 2% either side of each point: +-1.96 x 0.02 / sqrt(2) = 2.77% of throughput.
    half = 1.96 * 0.02 / math.sqrt(2)
    assert [plain["relative_95"], eagle3["relative_95"]] == pytest.approx([half, half])
    # Plain's replica serves 320 x (1 -+ 2.77%) tokens/s: hour 1's 3600 (with headroom) needs
    # ceil(3600 / 328.9) = 11 or ceil(3600 / 311.1) = 12 replicas, plus hour 0's one: $36 to
    # $39. EAGLE-3's 1333 x (1 -+ 2.77%) needs 3 either way: $12.
    assert (plain["bill_usd"], plain["bill_usd_95"]) == (39, [36, 39])
    assert (eagle3["bill_usd"], eagle3["bill_usd_95"]) == (12, [12, 12])
    assert body["achievable_savings_usd_95"] == [24, 27]
    low, high = body["served_bill_usd_95"]
    assert low <= body["served_bill_usd"] <= high
    assert body["over_provisioning_usd_95"] == pytest.approx([96 - high, 96 - low])
    assert body["auto"]["bill_usd_95"] == [12, 12]


async def test_without_an_objective_plain_wins_and_the_objective_that_would_pay_is_named(
    client: httpx.AsyncClient, app: FastAPI
) -> None:
    await _fleet(client, app)
    policy = {"mode": "pinned", "method": "eagle3", "itl_objective_ms": None}
    assert (await client.put(f"/admin/v1/models/{MODEL}/policy", json=policy)).status_code == 200
    params = {"model": MODEL, "from": HOUR.isoformat(), "to": (HOUR + HOURS_2).isoformat()}
    body = (await client.get("/admin/v1/fleet", params=params)).json()
    assert body["objective"]["sized_for"] == "throughput alone"
    methods = {m["method"]: m for m in body["methods"]}
    # For throughput alone a plain replica makes 3200 tokens/s, EAGLE-3 1600: plain needs
    # 1 + ceil(3600 / 3200) = 3 GPU-hours ($9), EAGLE-3 1 + ceil(3600 / 1600) = 4 ($12).
    assert (methods["plain"]["bill_usd"], methods["eagle3"]["bill_usd"]) == (9, 12)
    assert (body["best"], body["achievable_savings_usd"]) == ("plain", 0)
    # Within 45.25 ms per token (2^5.5) plain reaches 1024 tokens/s (45 streams), 5 GPU-hours,
    # EAGLE-3 still 1600: speculation pays; at 50 ms they tie, above it plain wins.
    assert body["objective"]["speculation_pays_below_itl_ms"] == pytest.approx(2**5.5)


async def test_no_price_means_no_bill_and_bad_input_is_refused(
    client: httpx.AsyncClient, app: FastAPI
) -> None:
    await _fleet(client, app)
    spot = await client.get("/admin/v1/fleet", params={"model": MODEL, "price_kind": "spot"})
    body = spot.json()
    assert all(m["bill_usd"] is None for m in body["methods"])
    assert (body["best"], body["achievable_savings_usd"], body["over_provisioning_usd"]) == (
        None,
        None,
        None,
    )
    assert_envelope(
        await client.get("/admin/v1/fleet", params={"model": MODEL, "price_kind": "x"}),
        422,
        param="price_kind",
    )
    assert_envelope(await client.get("/admin/v1/fleet", params={"model": "nope"}), 404)
    assert (await client.get("/admin/v1/fleet")).status_code == 422  # which model?
