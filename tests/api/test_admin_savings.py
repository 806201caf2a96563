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
    write_batch(app.state.components.sessions, records)
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


async def test_any_period_is_answered_exactly(client: httpx.AsyncClient, app: FastAPI) -> None:
    # Records at 10:04, 10:06, 11:30 and 12:10: whole hours come from the rollups, the
    # partial hours at the edges from the records, so a period starting at 10:05 counts the
    # request at 10:06 (the rollups alone would drop the hour 10:00, or count 10:04 in it).
    minutes = [4, 6, 90, 130]
    records = [
        entry(n, minute=m, completion_tokens=10 * (n + 1), api_key_id=None)
        for n, m in enumerate(minutes)
    ]
    write_batch(app.state.components.sessions, records)

    async def tokens(start: int, end: int) -> int:
        params = {
            "from": (HOUR + dt.timedelta(minutes=start)).isoformat(),
            "to": (HOUR + dt.timedelta(minutes=end)).isoformat(),
            "group_by": "model",
        }
        body = (await client.get("/admin/v1/savings", params=params)).json()
        return sum(r["completion_tokens"] for r in body["data"])

    def expected(start: int, end: int) -> int:
        pairs = zip(records, minutes, strict=True)
        return sum(r.completion_tokens for r, m in pairs if start <= m < end)

    for start, end in [(5, 7), (5, 200), (0, 60), (7, 131), (60, 120), (5, 125), (0, 4), (4, 5)]:
        assert await tokens(start, end) == expected(start, end), (start, end)


async def test_refused_requests_are_counted_apart(client: httpx.AsyncClient, app: FastAPI) -> None:
    served = [entry(n, api_key_id=None) for n in range(3)]
    refused = [
        entry(10 + n, api_key_id=None, method=None, backend_name=None, status_code=401,
              outcome="rejected", completion_tokens=0, cost_usd=None, baseline_cost_usd=None)
        for n in range(2)
    ]  # fmt: skip
    write_batch(app.state.components.sessions, served + refused)
    params = {"from": HOUR.isoformat(), "to": (HOUR + dt.timedelta(hours=1)).isoformat()}
    body = (await client.get("/admin/v1/savings", params=params | {"group_by": "model"})).json()
    assert [(r["model"], r["requests"], r["refused"]) for r in body["data"]] == [("m", 3, 2)]
    partial = params | {"from": (HOUR + dt.timedelta(minutes=1)).isoformat(), "group_by": "model"}
    body = (await client.get("/admin/v1/savings", params=partial)).json()
    assert [(r["requests"], r["refused"]) for r in body["data"]] == [(3, 2)]


async def test_intervals_are_the_sums_of_each_records_half_widths(
    client: httpx.AsyncClient, app: FastAPI
) -> None:
    # Half-widths of one curve move together, so a sum's interval is the sum of half-widths:
    # the same from the rollups (the whole hour 11:00) as from the records (the edges).
    minutes = [6, 70, 80, 130]
    records = [
        entry(n, minute=m, cost_usd=0.001, baseline_cost_usd=0.003,
              cost_error_usd=0.0001 * (n + 1), baseline_error_usd=0.0002)
        for n, m in enumerate(minutes)
    ]  # fmt: skip
    write_batch(app.state.components.sessions, records)
    params = {
        "from": (HOUR + dt.timedelta(minutes=5)).isoformat(),
        "to": (HOUR + dt.timedelta(minutes=135)).isoformat(),
        "group_by": "model",
    }
    [row] = (await client.get("/admin/v1/savings", params=params)).json()["data"]
    cost_error, baseline_error = 0.0001 * (1 + 2 + 3 + 4), 4 * 0.0002
    assert row["cost_usd_95"] == pytest.approx([0.004 - cost_error, 0.004 + cost_error])
    assert row["baseline_cost_usd_95"] == pytest.approx(
        [0.012 - baseline_error, 0.012 + baseline_error]
    )
    half = cost_error + baseline_error
    assert row["savings_usd_95"] == pytest.approx([0.008 - half, 0.008 + half])

    usage = (await client.get("/admin/v1/usage", params={"limit": 10})).json()["data"]
    assert [r["cost_error_usd"] for r in usage] == pytest.approx(
        [0.0001 * (n + 1) for n in range(4)]
    )


async def test_prefill_saved_by_cache_is_cached_tokens_at_each_records_prompt_price(
    client: httpx.AsyncClient, app: FastAPI
) -> None:
    # 10:06 and 12:10 from the records, 11:10 and 11:20 from the rollup of the hour 11:00.
    # Only a priced prompt saves: a record without a prompt price (unpriced) or without a
    # cached count (the backend did not say) saves nothing.
    cases = [  # minute, prompt tokens, cached, $/1M prompt tokens
        (6, 4000, 3984, 0.011),
        (70, 4000, 2048, 0.022),
        (80, 900, 0, 0.011),
        (90, 4000, 3984, None),
        (100, 4000, None, 0.011),
        (130, 600, 512, 0.011),
    ]
    records = [
        entry(n, minute=m, prompt_tokens=p, cached_prompt_tokens=c, prompt_usd_per_mtok=price)
        for n, (m, p, c, price) in enumerate(cases)
    ]
    write_batch(app.state.components.sessions, records)
    params = {
        "from": (HOUR + dt.timedelta(minutes=5)).isoformat(),
        "to": (HOUR + dt.timedelta(minutes=135)).isoformat(),
        "group_by": "model",
    }
    [row] = (await client.get("/admin/v1/savings", params=params)).json()["data"]
    assert row["cached_prompt_tokens"] == 3984 + 2048 + 3984 + 512
    saved = (3984 * 0.011 + 2048 * 0.022 + 512 * 0.011) / 1e6
    assert row["prefill_saved_by_cache_usd"] == pytest.approx(saved)
    # Prefill is the same for every method: the cache moves no saving against plain.
    assert row["savings_usd"] == pytest.approx(
        sum((e.baseline_cost_usd or 0) - (e.cost_usd or 0) for e in records)
    )

    usage = (await client.get("/admin/v1/usage", params={"limit": 10})).json()["data"]
    assert [r["cached_prompt_tokens"] for r in usage] == [c for _, _, c, _ in cases]
