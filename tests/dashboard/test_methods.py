"""The Methods page: the planner's curves and costs, and the policy control."""

from __future__ import annotations

import json
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from dashboard.client import refresh_reads
from dashboard.formats import usd
from tests.dashboard.conftest import MODEL, SWEPT, Stack

STABLE_ATTEMPTS = 10

TIMEOUT_S = 30.0


def _methods() -> None:
    from dashboard.app_pages import methods

    methods.render()


def test_methods_shows_costs_on_b200_and_h100_and_the_recommendation(
    dashboard_env: Stack,
) -> None:
    with dashboard_env.admin() as admin:
        plan = admin.get("/admin/v1/plan", params={"model": MODEL, "gpu": "H100"}).json()
    at = AppTest.from_function(_methods, default_timeout=TIMEOUT_S).run()
    assert not at.exception
    assert not at.error, [e.value for e in at.error]
    assert at.selectbox(key="methods-model").value == MODEL
    assert "Recommendation on B200" in at.success[0].value
    table = next(d.value for d in at.dataframe if "H100 best" in d.value.columns)
    first = plan["choices"][0]
    assert table["H100 best"].iloc[0] == f"{first['method']} K={first['k']}"
    price, band = table["$/1M H100 best"].iloc[0].split()  # "$0.0123 ±17%": the fit's interval
    assert price == usd(first["usd_per_mtok"])
    assert band == f"±{plan['fit']['relative_95']:.0%}"
    plain = first["usd_per_mtok"] * first["speedup_vs_plain"]
    assert table["$/1M H100 plain"].iloc[0] == usd(plain)
    assert "$/1M B200 plain" in table.columns
    assert "H100 $" in " ".join(c.value for c in at.caption)
    charts = at.get("vega_lite_chart") or at.get("arrow_vega_lite_chart")
    assert charts
    # One throughput chart: the curves that price requests. The planner's lines, which may
    # disagree with them, are the Planner page's what-if.
    assert not [c for c in charts if "planner line" in c.proto.spec]
    assert "on the Planner page: a what-if" in " ".join(c.value for c in at.caption)


def _page_with_stable_curves(stack: Stack) -> tuple[list[dict[str, Any]], AppTest]:
    """The Methods page and the curves it drew: the stack's collector stores a window every
    2 s, so the page is judged against curves read before and after it that are alike."""
    for _ in range(STABLE_ATTEMPTS):
        with stack.admin() as admin:
            before = admin.get("/admin/v1/curves", params={"model": MODEL}).json()["curves"]
            refresh_reads()  # the page reads afresh, not from a cache of an earlier test
            at = AppTest.from_function(_methods, default_timeout=TIMEOUT_S).run()
            after = admin.get("/admin/v1/curves", params={"model": MODEL}).json()["curves"]
        if before == after:
            return after, at
    pytest.fail(f"the curves changed during each of {STABLE_ATTEMPTS} page runs")


def test_methods_draws_the_curves_that_price_requests_with_their_bands(
    dashboard_env: Stack,
) -> None:
    curves, at = _page_with_stable_curves(dashboard_env)
    assert not at.exception
    assert "The curves that price requests now" in [h.value for h in at.subheader]
    table = next(d.value for d in at.dataframe if "95% interval" in d.value.columns)
    expected = [(c["method"], p["concurrency"], p) for c in curves for p in c["line"]]
    assert len(table) == len(expected)
    for (_, row), (method, concurrency, point) in zip(table.iterrows(), expected, strict=True):
        assert (row["method"], row["concurrency"], row["source"]) == (
            method, concurrency, point["source"],
        )  # fmt: skip
        if point["usd_per_mtok_95"] is not None:
            low, high = point["usd_per_mtok_95"]
            assert row["95% interval"] == f"${low:,.4f} to ${high:,.4f}"
    bands = [c.proto.spec for c in at.get("vega_lite_chart") if '"area"' in c.proto.spec]
    assert len(bands) == len({c["gpu_type"] for c in curves})  # a chart with its band per GPU


def test_methods_shows_measured_acceptance_from_the_sweeps(dashboard_env: Stack) -> None:
    at = AppTest.from_function(_methods, default_timeout=TIMEOUT_S).run()
    by_load = {"acceptance length", "concurrency"}  # the sweeps' table, not the live one
    table = next(d.value for d in at.dataframe if by_load <= set(d.value.columns))
    swept = table[table["backend"].isin(SWEPT)]
    assert set(swept["backend"]) == set(SWEPT)
    assert {1, 4, 16} <= set(swept["concurrency"])  # other tests may sweep more levels
    eagle3 = swept[swept["backend"] == "demo-eagle3"]
    assert (eagle3["acceptance length"].astype(float) > 1).all()  # a number, shown as text
    assert (eagle3["accepted per position"].str.count("%") == 3).all()  # K=3
    assert "Per-position acceptance at concurrency 1" in " ".join(c.value for c in at.caption)


TRIAL = {"drafter": "org/p-eagle-v2", "share": 0.2}


def test_the_policy_control_pins_a_method_through_the_admin_api(dashboard_env: Stack) -> None:
    rules = [{"when": ["structured_output"], "method": "plain", "k": None}]
    with dashboard_env.admin() as admin:  # set through the API: the page shows and keeps them
        # Pinned at once to p-eagle first, so the form's pin to dflash below is a move.
        body = {"mode": "pinned", "method": "p-eagle", "rules": rules, "drafter_trial": TRIAL,
                "lossless_quarantine": True}  # fmt: skip
        url = f"/admin/v1/models/{MODEL}/policy"
        put = admin.put(url, json=body, params={"immediate": "true"})
    assert put.status_code == 200, put.text
    refresh_reads()  # a change made beside the dashboard: drop its cached reads
    at = AppTest.from_function(_methods, default_timeout=TIMEOUT_S).run()
    assert any("Rules, checked in order" in c.value for c in at.caption)
    assert any(c.value.startswith("Drafter trial: 20% of each method") for c in at.caption)
    at.radio(key="policy-mode").set_value("pinned")
    at.selectbox(key="policy-method").set_value("dflash")
    at.number_input(key="policy-k").set_value(5)
    at.number_input(key="policy-itl").set_value(40.0)
    at.slider(key="policy-explore").set_value(0.1)
    at.button(key="policy-save").click().run()
    assert not at.exception
    assert (
        at.success[0].value
        == f"Policy of {MODEL} set to pinned to dflash K=5, per-token ≤ 40 ms, explore 10%"
    )
    # No demo backend drafts at K=5: saved, with a warning shown under the message.
    assert [w.value for w in at.warning] == [
        f"pinned: no enabled backend of {MODEL} runs dflash at K=5 (it runs at K=7); its "
        "requests go to those",
        f"drafter_trial: no enabled backend of {MODEL} runs drafter 'org/p-eagle-v2'; its "
        "method's requests go to its other backends until one does",
    ]
    current = "Current: **pinned to dflash K=5, per-token ≤ 40 ms, explore 10%**"
    assert current in [m.value for m in at.markdown]
    with dashboard_env.admin() as admin:
        policy = admin.get(f"/admin/v1/models/{MODEL}/policy").json()
        audit = admin.get("/admin/v1/audit", params={"resource_type": "model"}).json()["data"]
    assert policy == {
        "mode": "pinned",
        "method": "dflash",
        "k": 5,
        "itl_objective_ms": 40.0,
        "explore_fraction": 0.1,
        "rules": rules,  # saving the form kept them
        "classes": {},
        "drafter_trial": TRIAL,  # and it
        "lossless_quarantine": True,  # and it
    }
    assert any((e["after"] or {}).get("policy", {}).get("method") == "dflash" for e in audit)
    audit = next(d.value for d in at.dataframe if "change" in d.value.columns)
    # The update (the gradual move's steps may be audited after it, newest first).
    assert any("policy.method: p-eagle → dflash" in change for change in audit["change"])
    assert not any("{" in change for change in audit["change"]), list(audit["change"])
    # Pinned away from what auto served: the move goes in steps, and the page says so.
    assert any("Moving from p-eagle to dflash: 25% " in i.value for i in at.info)

    at.radio(key="policy-mode").set_value("auto")
    at.number_input(key="policy-itl").set_value(0.0)
    at.slider(key="policy-explore").set_value(0.0)
    edited = [{"when": ["logprobs", "class:batch"], "method": "eagle3", "k": 3}]
    at.text_area(key="policy-rules").set_value(json.dumps(edited))
    classes = {
        "interactive": {"objective": "latency", "itl_objective_ms": None, "max_usd_per_mtok": 0.5},
        "batch": {"objective": "cost", "itl_objective_ms": 80.0, "max_usd_per_mtok": None},
    }
    at.text_area(key="policy-classes").set_value(json.dumps(classes))
    at.button(key="policy-save").click().run()
    with dashboard_env.admin() as admin:
        policy = admin.get(f"/admin/v1/models/{MODEL}/policy").json()
    assert policy["mode"] == "auto"
    assert policy["method"] is None
    assert policy["rules"] == edited
    assert policy["classes"] == classes
    assert any("Request classes" in c.value for c in at.caption)
    table = next(d.value for d in at.dataframe if "objective" in d.value.columns)
    assert list(zip(table["class"], table["objective"], strict=True)) == [
        ("interactive", "latency"),
        ("batch", "cost"),
    ]

    at.text_area(key="policy-classes").set_value('{"batch": {"objective": "fastest"}}')
    at.button(key="policy-save").click().run()
    assert not at.exception
    assert "objective" in at.error[-1].value  # the admin API's 422, as a message
    at.text_area(key="policy-classes").set_value(json.dumps(classes))

    at.text_area(key="policy-rules").set_value('[{"when": ["json"], "method": "plain"}]')
    at.button(key="policy-save").click().run()
    assert not at.exception
    assert "structured_output" in at.error[-1].value  # the admin API's 422, as a message
    with dashboard_env.admin() as admin:
        assert admin.get(f"/admin/v1/models/{MODEL}/policy").json() == policy  # unchanged
    with dashboard_env.admin() as admin:
        assert admin.put(f"/admin/v1/models/{MODEL}/policy", json={}).status_code == 200
