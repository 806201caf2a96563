"""Live acceptance, auto-refreshing panels, the GPU catalog from the admin API, and the
pages that show real data the stack already holds (keyless traffic, stored measurements)."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from dashboard.client import refresh_reads
from dashboard.formats import money
from tests.dashboard.conftest import MODEL, SWEPT, Stack

TIMEOUT_S = 30.0
NO_DATA = "—"
UPDATED = re.compile(r"updated (\d\d:\d\d:\d\d) UTC \((refreshes every 5 s|auto-refresh paused)\)")


def _overview() -> None:
    from dashboard.app_pages import overview

    overview.render()


def _backends() -> None:
    from dashboard.app_pages import backends

    backends.render()


def _benchmarks() -> None:
    from dashboard.app_pages import benchmarks

    benchmarks.render()


def _planner() -> None:
    from dashboard.app_pages import planner

    planner.render()


def _methods() -> None:
    from dashboard.app_pages import methods

    methods.render()


def _keys() -> None:
    from dashboard.app_pages import keys

    keys.render()


def _run(script: Callable[[], None]) -> AppTest:
    at = AppTest.from_function(script, default_timeout=TIMEOUT_S).run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    return at


def _runtimes(stack: Stack) -> dict[str, dict[str, Any] | None]:
    with stack.admin() as admin:
        return {b["name"]: b["runtime"] for b in admin.get("/admin/v1/backends").json()["data"]}


def _shown(runtime: dict[str, Any] | None) -> tuple[str, str]:
    """How the Backends page writes a runtime's acceptance."""
    if runtime is None or runtime["acceptance_length"] is None:
        return NO_DATA, NO_DATA
    rates = " ".join(f"{r:.0%}" for r in runtime["acceptance_per_position"])
    return f"{runtime['acceptance_length']:.2f}", rates


def test_backends_show_live_acceptance_from_the_admin_api(dashboard_env: Stack) -> None:
    before = _runtimes(dashboard_env)
    at = _run(_backends)
    after = _runtimes(dashboard_env)
    rows = at.dataframe[0].value.set_index("name")
    for name in before:
        shown = (rows.loc[name, "acceptance length"], rows.loc[name, "accepted per position"])
        assert shown in {_shown(before[name]), _shown(after[name])}, name
    # Plain decoding drafts nothing: a dash, never a number.
    assert rows.loc["demo-plain", "acceptance length"] == NO_DATA
    assert rows.loc["demo-plain", "accepted per position"] == NO_DATA
    # The swept drafting backends drafted under load: their acceptance is real and > 1.
    for name in SWEPT[1:]:
        runtime = after[name]
        assert runtime is not None
        assert runtime["acceptance_source"] in {"scrape", "measurement"}
        assert float(rows.loc[name, "acceptance length"]) > 1
    eagle3 = rows.loc["demo-eagle3", "accepted per position"]
    assert eagle3.count("%") == 3  # K=3: one share per draft position
    assert rows.loc["demo-eagle3", "acceptance from"] in {"live scrape", "last stored measurement"}


def test_methods_shows_the_live_acceptance_of_the_models_backends(dashboard_env: Stack) -> None:
    at = _run(_methods)
    runtimes = _runtimes(dashboard_env)
    table = next(d.value for d in at.dataframe if "from" in d.value.columns)
    drafting = {n for n, r in runtimes.items() if r and r["acceptance_length"] is not None}
    assert set(table["backend"]) == drafting - {"demo-plain"}
    assert set(SWEPT[1:]) <= set(table["backend"])
    assert (table["acceptance length"] > 1).all()
    assert "**Now: each backend's latest acceptance**" in [m.value for m in at.markdown]


def _seconds(t: dt.time) -> int:
    return t.hour * 3600 + t.minute * 60 + t.second


@pytest.mark.parametrize(
    ("script", "key"),
    [(_backends, "backends-live"), (_overview, "overview-live"), (_benchmarks, "bench-live")],
)
def test_live_panels_say_when_they_were_updated_and_can_be_paused(
    dashboard_env: Stack, script: Callable[[], None], key: str
) -> None:
    at = _run(script)
    stamps = [m for c in at.caption if (m := UPDATED.search(c.value))]
    assert len(stamps) == 1, [c.value for c in at.caption]
    assert stamps[0].group(2) == "refreshes every 5 s"
    shown = dt.datetime.strptime(stamps[0].group(1), "%H:%M:%S").time()
    now = dt.datetime.now(dt.UTC)
    drift = abs(_seconds(now.time()) - _seconds(shown)) % 86_400
    assert min(drift, 86_400 - drift) < 120  # this run, on the UTC clock

    at.toggle(key=f"{key}-pause").set_value(True).run()
    assert not at.exception, at.exception
    paused = [m for c in at.caption if (m := UPDATED.search(c.value))]
    assert [m.group(2) for m in paused] == ["auto-refresh paused"]


def test_gpu_choices_come_from_the_admin_apis_catalog(dashboard_env: Stack) -> None:
    with dashboard_env.admin() as admin:
        gpus = [g["name"] for g in admin.get("/admin/v1/gpus").json()["data"]]
    assert {"B200", "H100"} <= set(gpus)
    planner = _run(_planner)
    assert list(planner.selectbox(key="plan-gpu").options) == gpus
    backends = _run(_backends)
    assert list(backends.selectbox(key="add-gpu").options) == gpus
    # Planning on the last catalogued GPU works from the page as for the first.
    planner.selectbox(key="plan-gpu").set_value(gpus[-1]).run()
    assert not planner.exception, planner.exception
    assert f"{gpus[-1]} at $" in planner.caption[0].value
    assert planner.caption[0].value.startswith("vllm's scheduling")
    planner.selectbox(key="plan-engine").set_value("sglang").run()
    assert not planner.exception, planner.exception
    assert planner.caption[0].value.startswith("sglang's scheduling")


def test_keys_page_shows_traffic_sent_without_a_key(dashboard_env: Stack) -> None:
    at = _run(_keys)
    with dashboard_env.admin() as admin:
        rows = admin.get("/admin/v1/savings", params={"group_by": "key"}).json()["data"]
    keyless = next(r for r in rows if r["key"] == 0)  # the rollups' key for no key
    assert keyless["requests"] >= dashboard_env.requests
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Requests"] == f"{keyless['requests']:,}"
    assert "Without an API key (30 days)" in [h.value for h in at.subheader]


def test_benchmarks_lists_the_stored_measurements(dashboard_env: Stack) -> None:
    def newest() -> list[tuple[object, ...]]:
        with dashboard_env.admin() as admin:
            rows = admin.get("/admin/v1/measurements", params={"limit": 20}).json()["data"]
        labels = {"scrape": "live traffic (collector)", "bench": "sweep", "import": "imported"}
        return [
            (m["backend_name"], m["method"], round(m["concurrency"], 2), labels[m["source"]])
            for m in rows
        ]

    before = newest()
    at = _run(_benchmarks)
    after = newest()
    table = next(d.value for d in at.dataframe if "source" in d.value.columns)
    shown = list(table[["backend", "method", "concurrency", "source"]].itertuples(index=False))
    assert [tuple(row) for row in shown] in (before, after)
    assert len(shown) > 0  # the fixture's sweeps and traffic were stored
    assert set(table["model"]) == {MODEL}
    assert any(c.value.startswith(f"The latest {len(shown)}, newest first") for c in at.caption)


def test_overview_keeps_capacity_cost_and_gpu_spend_apart(dashboard_env: Stack) -> None:
    def read() -> tuple[list[dict[str, Any]], float]:
        with dashboard_env.admin() as admin:
            rows = admin.get("/admin/v1/savings").json()["data"]
            start = dt.datetime.now(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
            spend = admin.get(
                "/admin/v1/spend", params={"from": (start - dt.timedelta(days=7)).isoformat()}
            ).json()
        return rows, float(spend["total_usd"])

    refresh_reads()  # an earlier test's page read the same spend, cached for a few seconds
    rows, spend_before = read()
    at = _run(_overview)
    _, spend_after = read()
    metrics = {m.label: m for m in at.metric}
    cost = sum(r["cost_usd"] for r in rows)
    saved = sum(r["savings_usd"] for r in rows)
    baseline = sum(r["baseline_cost_usd"] for r in rows)
    assert metrics["Capacity cost"].value == f"${cost:,.4f}"
    assert metrics["Capacity cost vs plain"].value == f"${saved:,.4f} less"
    assert metrics["Capacity cost vs plain"].delta.startswith("95%: ")  # all of it shows
    below = f"Capacity cost vs plain: {saved / baseline:.0%} below plain decoding at the same load"
    caption = next(c.value for c in at.caption if c.value.startswith(below))
    assert "not money saved" in caption
    spent = float(metrics["Actual GPU spend (7 days, on-demand)"].value.lstrip("$"))
    assert round(spend_before, 2) <= spent <= round(spend_after, 2)
    assert any("capacity cost (USD)" in d.value.columns for d in at.dataframe)


def test_overview_leads_with_the_bill_right_sized_bills_and_gpus_to_release(
    dashboard_env: Stack,
) -> None:
    refresh_reads()
    at = _run(_overview)
    with dashboard_env.admin() as admin:
        start = dt.datetime.now(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        fleet = admin.get(
            "/admin/v1/fleet",
            params={"model": MODEL, "from": (start - dt.timedelta(days=7)).isoformat()},
        ).json()
    headers = [h.value for h in at.subheader]
    assert headers.index("The bill, fleets sized for the traffic, GPUs to release") < (
        headers.index("Traffic and capacity cost")
    )
    metrics = {m.label: m for m in at.metric}
    labels = list(metrics)
    assert labels.index("Bill (7 days)") < labels.index("Capacity cost")  # money first
    assert metrics["Bill (7 days)"].value.startswith("$")
    plain = next(m for m in fleet["methods"] if m["method"] == "plain")
    assert plain["bill_usd"] is not None  # plain is always sized, as the baseline
    if fleet["achievable_savings_usd"] is not None:
        shown = metrics["Achievable savings vs plain"].value
        assert shown == money(fleet["achievable_savings_usd"])  # -$1.25 when negative
    sized = next(d.value for d in at.dataframe if "right-sized bill" in d.value.columns)
    assert set(sized["method"]) == {m["method"] for m in fleet["methods"]}
    # "measured, ±3%": the source and the band of the curve at the operating point (read
    # apart from the page: a window stored in between may move the band, not the form).
    for curve in sized["curve"]:
        source, band = curve.split(", ±")
        assert source in {"measured", "estimated"}
        assert band.endswith("%")
        assert float(band.removesuffix("%")) >= 0
