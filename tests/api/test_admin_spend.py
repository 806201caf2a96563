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


def test_held_intervals_follow_enable_disable_and_delete() -> None:
    entries = [
        audit(0, "create", {"enabled": True, "gpu_count": 2}),
        audit(5, "update", {"enabled": False, "gpu_count": 2}),
        audit(8, "update", {"enabled": True, "gpu_count": 2}),
        audit(10, "delete", None),
    ]
    [(name, (described, intervals))] = held_intervals(entries, T0 + dt.timedelta(hours=99)).items()
    assert name == "b"
    assert described["gpu_count"] == 2
    hours = [
        ((a - T0) / dt.timedelta(hours=1), (b - T0) / dt.timedelta(hours=1)) for a, b in intervals
    ]
    assert hours == [(0, 5), (8, 10)]


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
