"""Savings from the rollups equal the sum over usage records of tokens x (baseline - cost)."""

from __future__ import annotations

import datetime as dt

import httpx
import pytest
from fastapi import FastAPI

from gateway.accounting import write_batch
from tests.api.test_admin_backends import assert_envelope
from tests.api.test_ledger import HOUR, entry


async def test_savings_equal_the_records_sum(client: httpx.AsyncClient, app: FastAPI) -> None:
    records = [
        entry(
            n,
            method=method,
            completion_tokens=tokens,
            cost_usd=cost,
            baseline_cost_usd=base,
            api_key_id=None,
        )
        for n, (method, tokens, cost, base) in enumerate(
            [
                ("p-eagle", 100, 0.0010, 0.0030),
                ("p-eagle", 50, 0.0005, 0.0015),
                ("plain", 80, 0.0024, 0.0024),
                ("dflash", 40, 0.0006, 0.0012),
            ]
        )
    ]
    write_batch(app.state.services.sessions, records)
    params = {
        "from": (HOUR - dt.timedelta(hours=1)).isoformat(),
        "to": (HOUR + dt.timedelta(hours=2)).isoformat(),
    }
    body = (await client.get("/admin/v1/savings", params=params)).json()
    by_method = {row["method"]: row for row in body["data"]}
    assert by_method["p-eagle"]["completion_tokens"] == 150
    assert by_method["p-eagle"]["savings_usd"] == pytest.approx(0.0030)
    assert by_method["plain"]["savings_usd"] == pytest.approx(0.0)
    total = sum(r["savings_usd"] for r in body["data"])
    expected = sum((e.baseline_cost_usd or 0) - (e.cost_usd or 0) for e in records)
    assert total == pytest.approx(expected)

    by_model = (await client.get("/admin/v1/savings", params=params | {"group_by": "model"})).json()
    assert [(r["model"], r["requests"]) for r in by_model["data"]] == [("m", 4)]
    outside = {"from": (HOUR + dt.timedelta(hours=5)).isoformat()}
    assert (await client.get("/admin/v1/savings", params=outside)).json()["data"] == []


async def test_unknown_group_is_422(client: httpx.AsyncClient) -> None:
    response = await client.get("/admin/v1/savings", params={"group_by": "model,colour"})
    assert "colour" in assert_envelope(response, 422, param="group_by")
