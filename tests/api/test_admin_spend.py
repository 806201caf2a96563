"""Actual spend: GPU-hours held (from the audit log) times price."""

from __future__ import annotations

import datetime as dt

import httpx
import pytest

from gateway.db.tables import AuditEntry
from gateway.services.spend import held_intervals
from tests.api.test_admin_backends import EAGLE3

T0 = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)


def audit(hours: float, action: str, after: dict[str, object] | None) -> AuditEntry:
    at = T0 + dt.timedelta(hours=hours)
    return AuditEntry(
        at=at,
        actor="t",
        action=action,
        resource_type="backend",
        resource_id="b",
        before=None,
        after=after,
    )


def _hours(at: dt.datetime) -> float:
    return (at - T0) / dt.timedelta(hours=1)


def test_held_intervals_follow_enable_disable_and_delete() -> None:
    entries = [
        audit(0, "create", {"enabled": True, "gpu_count": 2}),
        audit(5, "update", {"enabled": False, "gpu_count": 2}),
        audit(8, "update", {"enabled": True, "gpu_count": 2}),
        audit(10, "delete", None),
    ]
    held = held_intervals(entries, T0 + dt.timedelta(hours=99))
    assert [(h.backend, _hours(h.start), _hours(h.end), h.gpu_count) for h in held] == [
        ("b", 0, 5, 2),
        ("b", 8, 10, 2),
    ]


def test_each_interval_keeps_the_gpu_count_in_force_and_a_switch_is_not_its_state() -> None:
    entries = [
        audit(0, "create", {"enabled": True, "gpu_count": 1}),
        audit(10, "update", {"enabled": True, "gpu_count": 8}),
        # the switched-in backend's description, audited on the old one: not the old's state
        audit(11, "switch", {"enabled": True, "gpu_count": 4, "name": "other"}),
        audit(12, "delete", None),
    ]
    held = held_intervals(entries, T0 + dt.timedelta(hours=99))
    spans = [(_hours(h.start), _hours(h.end), h.gpu_count) for h in held]
    assert spans == [(0, 10, 1), (10, 12, 8)]
    gpu_hours = sum(h.hours_within(T0, T0 + dt.timedelta(days=1)) * h.gpu_count for h in held)
    assert gpu_hours == 10 * 1 + 2 * 8  # not 12 hours on 8 GPUs


async def test_spend_prices_the_hours_held(client: httpx.AsyncClient) -> None:
    price = {"gpu_type": "H100", "usd_per_gpu_hour": 3.0, "source": "t", "date": "2026-11-01"}
    await client.post("/admin/v1/prices", json=price)
    await client.post("/admin/v1/backends", json={**EAGLE3, "gpu_type": "H100", "gpu_count": 4})
    body = (await client.get("/admin/v1/spend")).json()
    [row] = body["data"]
    assert (row["backend"], row["gpu_type"], row["usd_per_gpu_hour"]) == (
        "qwen-eagle3",
        "H100",
        3.0,
    )
    assert 0 < row["gpu_hours"] < 0.01  # held for the moments since it was created, on 4 GPUs
    assert row["usd"] == pytest.approx(row["gpu_hours"] * 3.0)
    assert body["total_usd"] == pytest.approx(row["usd"])


async def test_a_gpu_count_change_bills_each_count_for_its_own_hours(
    client: httpx.AsyncClient,
) -> None:
    price = {"gpu_type": "H100", "usd_per_gpu_hour": 3.0, "source": "t", "date": "2026-11-01"}
    await client.post("/admin/v1/prices", json=price)
    await client.post("/admin/v1/backends", json={**EAGLE3, "gpu_type": "H100", "gpu_count": 1})
    patched = await client.patch("/admin/v1/backends/qwen-eagle3", json={"gpu_count": 8})
    assert patched.status_code == 200, patched.text
    body = (await client.get("/admin/v1/spend")).json()
    counts = sorted(r["gpu_count"] for r in body["data"])
    assert counts == [1, 8]  # one row per configuration, each with its own hours
    assert body["gpu_hours"] == pytest.approx(sum(r["gpu_hours"] for r in body["data"]))
    assert body["total_usd"] == pytest.approx(body["gpu_hours"] * 3.0)


async def test_no_price_is_null_not_zero_and_an_unknown_kind_is_refused(
    client: httpx.AsyncClient,
) -> None:
    await client.post("/admin/v1/backends", json={**EAGLE3, "gpu_type": "H100"})
    body = (await client.get("/admin/v1/spend", params={"price_kind": "spot"})).json()
    [row] = body["data"]
    assert (row["usd"], row["usd_per_gpu_hour"], body["total_usd"]) == (None, None, None)
    assert body["unpriced_gpu_hours"] == pytest.approx(row["gpu_hours"])
    refused = await client.get("/admin/v1/spend", params={"price_kind": "cheap"})
    assert refused.status_code == 422
    assert refused.json()["error"]["param"] == "price_kind"
