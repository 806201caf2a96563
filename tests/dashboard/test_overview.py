"""The Overview page against a real gateway with ledger data."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import re
import time
from typing import Any

import httpx
import pyarrow
from streamlit.testing.v1 import AppTest

from dashboard.client import refresh_reads
from tests.dashboard.conftest import MODEL, Stack

TIMEOUT_S = 30.0


def _table(at: AppTest, column: str) -> Any:
    """The first table on the page with `column`."""
    return next(d.value for d in at.dataframe if column in d.value.columns)


def _overview() -> None:
    from dashboard.app_pages import overview

    overview.render()


def test_overview_shows_requests_tokens_cost_and_savings(dashboard_env: Stack) -> None:
    with dashboard_env.admin() as admin:
        rows = admin.get("/admin/v1/savings").json()["data"]
    at = AppTest.from_function(_overview, default_timeout=TIMEOUT_S).run()
    assert not at.exception
    assert not at.error, [e.value for e in at.error]
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Requests (7 days)"] == f"{sum(r['requests'] for r in rows):,}"
    assert metrics["Output tokens"] == f"{sum(r['completion_tokens'] for r in rows):,}"
    table = _table(at, "capacity cost (USD)")
    assert set(table["model"]) == {MODEL}
    assert set(table["method"]) == {r["method"] for r in rows}
    captions = " ".join(c.value for c in at.caption)
    assert "B200 $" in captions
    assert "/GPU-h on-demand" in captions
    # Every $ figure with its interval: the capacity cost's is the sum of the rows'.
    cost = next(m for m in at.metric if m.label == "Capacity cost")
    low = sum(r["cost_usd_95"][0] for r in rows)
    high = sum(r["cost_usd_95"][1] for r in rows)
    assert cost.delta == f"95%: ${low:,.4f} to ${high:,.4f}"  # costs are never negative
    assert "95%" in next(m for m in at.metric if m.label == "Achievable savings vs plain").delta
    [button] = at.get("download_button")
    assert "usage records" in button.proto.label


def test_refused_requests_are_counted_apart_not_as_a_row_of_zeros(
    dashboard_env: Stack,
) -> None:
    body = {"model": "no/such-model", "messages": [{"role": "user", "content": "hi"}]}
    refused = httpx.post(f"{dashboard_env.gateway.base_url}/v1/chat/completions", json=body)
    assert refused.status_code == 404, refused.text
    with dashboard_env.admin() as admin:  # the ledger writes in the background
        deadline = time.monotonic() + TIMEOUT_S
        while not any(
            r["model"] == "unknown" for r in admin.get("/admin/v1/savings").json()["data"]
        ):
            assert time.monotonic() < deadline, "the refused request was never recorded"
            time.sleep(0.1)
        rows = admin.get("/admin/v1/savings").json()["data"]
    refused = sum(r["refused"] for r in rows)
    assert refused >= 1
    refresh_reads()  # the page reads afresh, not from a cache of an earlier test
    at = AppTest.from_function(_overview, default_timeout=TIMEOUT_S).run()
    assert not at.exception
    assert set(_table(at, "capacity cost (USD)")["model"]) == {MODEL}
    captions = " ".join(c.value for c in at.caption)
    assert f"Not in the table: {refused:,} request(s) refused before any backend" in captions


def test_the_usage_download_is_the_apis_csv(dashboard_env: Stack) -> None:
    from dashboard.client import AdminClient
    from tests.e2e.conftest import ADMIN_TOKEN

    start = dt.datetime.now(dt.UTC) - dt.timedelta(days=7)
    api = AdminClient(dashboard_env.gateway.base_url, ADMIN_TOKEN)
    rows = list(csv.DictReader(io.StringIO(api.usage_csv(start).decode())))
    with dashboard_env.admin() as admin:
        records = admin.get("/admin/v1/usage", params={"limit": 1000}).json()["data"]
    assert [r["request_id"] for r in rows] == [r["request_id"] for r in records]
    assert len(rows) >= dashboard_env.requests


def _chart_values(at: AppTest, x_field: str) -> list[dict[str, Any]]:
    """The data (sent as Arrow) of the chart whose x axis is `x_field`."""
    charts = at.get("vega_lite_chart")
    chart = next(c for c in charts if json.loads(c.proto.spec)["encoding"]["x"]["field"] == x_field)
    rows: list[dict[str, Any]] = (
        pyarrow.ipc.open_stream(chart.proto.data.data).read_all().to_pylist()
    )
    return rows


def test_overview_trend_adds_up_to_the_period_totals(dashboard_env: Stack) -> None:
    at = AppTest.from_function(_overview, default_timeout=TIMEOUT_S).run()
    days = _chart_values(at, "day")
    assert len({d["day"] for d in days}) == 8  # seven days back to midnight, and today
    table = _table(at, "capacity cost (USD)")
    cost = sum(d["usd"] for d in days if d["figure"] == "capacity cost")
    saved = sum(d["usd"] for d in days if d["figure"] == "capacity cost below plain")
    assert abs(cost - table["capacity cost (USD)"].sum()) < 1e-9
    assert abs(saved - table["difference (USD)"].sum()) < 1e-9
    assert saved > 0


def test_a_price_kind_with_no_price_says_so_and_where_to_set_one(dashboard_env: Stack) -> None:
    with dashboard_env.admin() as admin:
        prices = admin.get("/admin/v1/prices").json()["data"]
    assert not [p for p in prices if p["kind"] == "spot" and p["gpu_type"] == "B200"]
    at = AppTest.from_function(_overview, default_timeout=TIMEOUT_S).run()
    at.radio(key="overview-price").set_value("spot").run()
    assert not at.exception
    warnings = " ".join(w.value for w in at.warning)
    assert "No spot price for B200" in warnings, warnings
    assert "[Prices](prices)" in warnings
    labels = {m.label for m in at.metric}
    assert "Right-sized bill (best method)" not in labels  # no figure at a price not set
    assert "GPUs you could release now" in labels  # what needs no price still shows


def _dollars(text: str) -> list[float]:
    """Every dollar figure in `text`, as printed ($1,234.56 or -$0.25)."""
    found = re.findall(r"(-?)\$([\d,]+\.\d\d)\b", text)
    return [float(sign + digits.replace(",", "")) for sign, digits in found]


def test_the_verdict_adds_up_and_the_what_if_objective_changes_no_policy(
    dashboard_env: Stack,
) -> None:
    with dashboard_env.admin() as admin:
        policy_before = admin.get(f"/admin/v1/models/{MODEL}/policy").json()
    at = AppTest.from_function(_overview, default_timeout=TIMEOUT_S).run()
    assert not at.exception
    assert not at.error, [e.value for e in at.error]
    sentence = next(m.value for m in at.markdown if m.value.startswith("**You paid $"))
    assert at.info, "no action"
    split = next(c.value for c in at.caption if c.value.startswith("Bill $"))
    bill, best, mix, over = _dollars(split)
    assert round(best + mix + over, 2) == bill, split  # to the cent, as printed
    assert _dollars(sentence)[0] == bill  # the sentence's figure is the bill's

    at.number_input(key="overview-what-if").set_value(4.0).run()
    assert not at.exception
    assert any("within 4 ms per token" in c.value for c in at.caption)
    with dashboard_env.admin() as admin:
        assert admin.get(f"/admin/v1/models/{MODEL}/policy").json() == policy_before
        what_if = admin.get("/admin/v1/fleet", params={"model": MODEL, "objective_ms": 4}).json()
    assert what_if["objective"] == {
        "itl_ms": 4.0,
        "sized_for": "what-if itl objective",
        "speculation_pays_below_itl_ms": None,
    }
