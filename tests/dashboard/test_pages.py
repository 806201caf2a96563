"""Planner, Backends, Benchmarks, Keys and Accuracy pages against the real stack."""

from __future__ import annotations

import time

from streamlit.testing.v1 import AppTest

from dashboard.client import refresh_reads
from dashboard.formats import usd
from tests.dashboard.conftest import MODEL, Stack, wait_for_benchmark, wait_for_runtime
from tests.e2e.conftest import closed_url

TIMEOUT_S = 30.0


def _planner() -> None:
    from dashboard.app_pages import planner

    planner.render()


def _backends() -> None:
    from dashboard.app_pages import backends

    backends.render()


def _benchmarks() -> None:
    from dashboard.app_pages import benchmarks

    benchmarks.render()


def _keys() -> None:
    from dashboard.app_pages import keys

    keys.render()


def _prices() -> None:
    from dashboard.app_pages import prices

    prices.render()


def _accuracy() -> None:
    from dashboard.app_pages import accuracy

    accuracy.render()


def _run(script: object) -> AppTest:
    at = AppTest.from_function(script, default_timeout=TIMEOUT_S).run()  # type: ignore[arg-type]
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    return at


def test_planner_prices_the_traffic_per_method_and_renders_vllm_serve(dashboard_env: Stack) -> None:
    at = _run(_planner)
    with dashboard_env.admin() as admin:
        params = {
            "model": MODEL,
            "gpu": "B200",
            "itl_objective_ms": 50.0,
            "output_tokens_per_s": 50_000.0,
        }
        plan = admin.get("/admin/v1/plan", params=params).json()
    capacity = plan["capacity"]
    table = at.dataframe[0].value
    assert set(table["method"]) == {m["method"] for m in capacity["methods"]}
    cheapest = min(capacity["methods"], key=lambda m: m["usd_per_month"])
    assert table["method"].iloc[0] == cheapest["method"]
    assert table["per month"].iloc[0] == usd(cheapest["usd_per_month"])
    assert at.code, [w.value for w in at.warning]
    assert f"vllm serve {MODEL}" in at.code[0].value
    assert "services:" in at.code[1].value
    if cheapest["method"] in plan["schedules"]:
        assert "num_speculative_tokens_per_batch_size" in at.code[0].value
    started = max([cheapest["k"], *(e[2] for e in plan["schedules"].get(cheapest["method"], []))])
    deploy = f"**Deploy {cheapest['method']} (K={started})** on "
    assert any(m.value.startswith(deploy) for m in at.markdown)
    said = [c.value for c in at.caption if "is what vLLM is started with" in c.value]
    if started == cheapest["k"]:  # the table's K, and the one vLLM starts with: no note
        assert not said
    else:  # the schedule drafts more at small batches: the page says why the two differ
        assert len(said) == 1
        assert f"it drafts K={cheapest['k']}, the table's" in said[0]
    saved = capacity["savings_usd_per_month"]["vs_plain"][cheapest["method"]]
    assert table["saves vs plain per month"].iloc[0] == usd(saved)
    assert "50,000 output tokens/s" in at.caption[0].value
    band = capacity["savings_usd_per_month_95"]["vs_plain"][cheapest["method"]]
    # None: the fit's band is +-100% or wider on these few short test measurements
    shown = "too little data" if band is None else f"${band[0]:,.0f} to ${band[1]:,.0f}"
    assert table["saves vs plain, 95%"].iloc[0] == shown
    # The what-if's own lines: a line for every method, apart from the curves that price
    charts = at.get("vega_lite_chart") or at.get("arrow_vega_lite_chart")
    [spec] = [c.proto.spec for c in charts if "planner line" in c.proto.spec]
    assert all(f'"{m}"' in spec for m in ("plain", "eagle3", "p-eagle", "dflash", "dspark"))
    assert "The planner's lines (what-if)" in [h.value for h in at.subheader]
    # Beside the what-if, the curves the gateway prices with on that GPU.
    assert "The curves that price requests now" in [h.value for h in at.subheader]
    assert any("95% interval" in d.value.columns for d in at.dataframe)


def test_backends_lists_the_fleet_and_adds_disables_and_removes_one(dashboard_env: Stack) -> None:
    at = _run(_backends)
    table = at.dataframe[0].value
    assert {"demo-plain", "demo-eagle3", "demo-p-eagle", "demo-dflash", "demo-dspark"} <= set(
        table["name"]
    )
    rows = table.set_index("name")
    assert rows.loc["demo-p-eagle", "method"] == "p-eagle"
    assert rows.loc["demo-p-eagle", "health"] == "healthy"  # the gateway's live view
    assert rows.loc["demo-p-eagle", "KV cache"].endswith("%")
    assert not at.warning  # every demo simulator runs the method it declares

    at.text_input(key="add-name").set_value("dash-extra")
    at.text_input(key="add-url").set_value(closed_url())
    at.text_input(key="add-model").set_value(MODEL)
    at.button(key="add-save").click().run()
    assert at.success[0].value == f"Added dash-extra (plain) for {MODEL}"  # above the table,
    assert "dash-extra" in set(at.dataframe[0].value["name"])  # which shows it at once
    with dashboard_env.admin() as admin:
        assert admin.get("/admin/v1/backends/dash-extra").json()["enabled"] is True

    at = _run(_backends)
    at.selectbox(key="change-name").set_value("dash-extra").run()
    at.button(key="change-toggle").click().run()
    assert at.success[0].value == "dash-extra is now disabled"
    assert at.dataframe[0].value.set_index("name").loc["dash-extra", "health"] == "disabled"
    assert at.button(key="change-toggle").label == "Enable dash-extra"
    with dashboard_env.admin() as admin:
        assert admin.get("/admin/v1/backends/dash-extra").json()["enabled"] is False

    at.checkbox(key="change-sure").check().run()
    at.button(key="change-remove").click().run()
    assert at.success[0].value == "Removed dash-extra"
    assert "dash-extra" not in set(at.dataframe[0].value["name"])
    assert "dash-extra" not in at.selectbox(key="change-name").options
    with dashboard_env.admin() as admin:
        assert admin.get("/admin/v1/backends/dash-extra").status_code == 404


def test_backends_warn_of_a_backend_no_curve_prices(dashboard_env: Stack) -> None:
    """A model the planner has no spec for, never measured: its requests are charged by GPU
    time, and the page says so."""
    backend = {"name": "dash-private", "url": closed_url(), "model": "acme/private-chat",
               "method": "plain"}  # fmt: skip
    with dashboard_env.admin() as admin:
        assert admin.post("/admin/v1/backends", json=backend).status_code == 201
        # The gateway reports a backend's runtime once its registry has refreshed.
        wait_for_runtime(admin, "dash-private")
    refresh_reads()  # added behind the dashboard's back: as its read cache expiring
    try:
        warnings = [w.value for w in _run(_backends).warning]
        assert any(w.startswith("dash-private: no throughput curve") for w in warnings), warnings
        assert all(w.startswith("dash-private") for w in warnings), warnings
    finally:
        with dashboard_env.admin() as admin:
            assert admin.delete("/admin/v1/backends/dash-private").status_code == 204


def test_benchmarks_starts_a_sweep_and_shows_its_levels(dashboard_env: Stack) -> None:
    at = _run(_benchmarks)
    at.selectbox(key="bench-backend").set_value("demo-eagle3")
    at.text_input(key="bench-levels").set_value("1,2")
    at.number_input(key="bench-requests").set_value(4)
    at.button(key="bench-start").click().run()
    message = at.success[-1].value
    assert "against demo-eagle3: levels [1, 2]" in message
    run_id = int(message.split()[2])
    with dashboard_env.admin() as admin:
        run = wait_for_benchmark(admin, run_id)
    assert run["status"] == "succeeded", run

    at.button(key="bench-refresh").click().run()
    expander = next(e for e in at.expander if e.label.startswith(f"#{run_id} "))
    assert expander.label == f"#{run_id} demo-eagle3: succeeded"
    levels = expander.dataframe[0].value
    assert list(levels["concurrency"]) == [1, 2]
    assert list(levels["completed"]) == [4, 4]


def test_keys_creates_a_key_shown_once_and_revokes_it(dashboard_env: Stack) -> None:
    at = _run(_keys)
    at.text_input(key="key-name").set_value("dash-key")
    at.number_input(key="key-budget").set_value(5.0)
    at.button(key="key-create").click().run()
    secret = at.code[0].value
    with dashboard_env.admin() as admin:
        [key] = [k for k in admin.get("/admin/v1/keys").json()["data"] if k["name"] == "dash-key"]
    assert secret.startswith(key["key_prefix"])
    assert key["budget_usd"] == 5.0
    assert at.success[0].value.startswith(f"Created key {key['id']} (dash-key)")
    table = at.dataframe[0].value.set_index("name")  # the new key listed at once
    assert (table.loc["dash-key", "budget"], table.loc["dash-key", "revoked"]) == ("$5.00", "—")
    assert table.loc["dash-key", "spent (30 days)"] == "$0.0000"

    at = _run(_keys)
    assert not at.code  # shown only once
    assert "dash-key" in " ".join(at.selectbox(key="usage-csv-of").options)  # its records
    label = next(o for o in at.selectbox(key="revoke-key").options if "dash-key" in o)
    at.selectbox(key="revoke-key").set_value(label)
    at.button(key="revoke").click().run()
    assert at.success[0].value == f"Revoked key {key['id']}"
    assert "dash-key" not in set(at.dataframe[0].value["name"])  # revoked keys are hidden,
    assert not any("dash-key" in o for o in at.selectbox(key="revoke-key").options)
    at.toggle(key="keys-show-revoked").set_value(True).run()  # unless asked for
    revoked_at = at.dataframe[0].value.set_index("name").loc["dash-key", "revoked"]
    assert revoked_at.endswith(" UTC")
    with dashboard_env.admin() as admin:
        revoked = admin.get(f"/admin/v1/keys/{key['id']}").json()
    assert revoked["revoked_at"] is not None
    assert revoked_at == f"{revoked['revoked_at'][:10]} {revoked['revoked_at'][11:16]} UTC"


def test_prices_names_the_missing_price_then_sets_changes_and_removes_it(
    dashboard_env: Stack,
) -> None:
    at = _run(_prices)
    table = at.dataframe[0].value
    assert "B200" in set(table["GPU"])  # the demo's seeded prices, listed
    assert any("B200 spot" in w.value for w in at.warning), [w.value for w in at.warning]

    at.selectbox(key="price-gpu").set_value("B200")
    at.selectbox(key="price-kind").set_value("spot")
    at.number_input(key="price-usd").set_value(2.5)
    at.text_input(key="price-source").set_value("a test's quote")
    at.button(key="price-save").click().run()
    assert at.success[0].value == "Added the spot price of B200: $2.50/GPU-h"
    with dashboard_env.admin() as admin:
        spot = [p for p in admin.get("/admin/v1/prices").json()["data"] if p["kind"] == "spot"]
    [price] = [p for p in spot if p["gpu_type"] == "B200"]
    assert (price["usd_per_gpu_hour"], price["source"]) == (2.5, "a test's quote")
    assert not any("B200 spot" in w.value for w in at.warning)  # no longer missing

    at.number_input(key="price-usd").set_value(3.0)
    at.button(key="price-save").click().run()  # the same GPU and kind: changed, not added
    assert at.success[0].value == "Changed the spot price of B200 to $3.00/GPU-h"
    label = next(o for o in at.selectbox(key="price-remove").options if o.startswith("B200 spot"))
    at.selectbox(key="price-remove").set_value(label)
    at.button(key="price-remove-button").click().run()
    assert at.success[0].value == f"Removed the price {label}"
    with dashboard_env.admin() as admin:
        prices = admin.get("/admin/v1/prices").json()["data"]
        audit = {"resource_type": "gpu_price", "resource_id": "B200/spot"}
        entries = admin.get("/admin/v1/audit", params=audit).json()["data"]
    assert not [p for p in prices if (p["gpu_type"], p["kind"]) == ("B200", "spot")]
    assert {"create", "update", "delete"} <= {e["action"] for e in entries}


def test_accuracy_lists_every_measured_point_with_the_mean_error(dashboard_env: Stack) -> None:
    with dashboard_env.admin() as admin:
        before = admin.get("/admin/v1/accuracy").json()
    at = _run(_accuracy)
    with dashboard_env.admin() as admin:
        after = admin.get("/admin/v1/accuracy").json()
    rows = at.dataframe[0].value
    assert len(before["points"]) <= len(rows) <= len(after["points"])
    assert set(rows["method"]) <= {p["method"] for p in after["points"]}
    assert set(rows["model"]) == {MODEL}
    shown = at.metric[0].value
    expected = {
        f"{d['mean_absolute_error']:.1%}" if d["mean_absolute_error"] is not None else "—"
        for d in (before, after)
    }
    assert shown in expected


def test_backends_shows_each_pool_and_whether_its_discovery_works(dashboard_env: Stack) -> None:
    pool = {
        "discovery": {"dns": "dash-pool.invalid", "port": 8000},
        "backend": {"model": MODEL, "method": "plain", "gpu_type": "H100"},
    }
    with dashboard_env.admin() as admin:
        assert admin.put("/admin/v1/pools/dash-pool", json=pool).status_code == 200
        try:
            deadline = time.monotonic() + 60  # discovery's next round (every 10 s)
            while admin.get("/admin/v1/pools/dash-pool").json()["discovery_error"] is None:
                assert time.monotonic() < deadline, "discovery never tried the pool"
                time.sleep(0.2)
            table = _run(_backends).dataframe[1].value.set_index("pool")
        finally:
            assert admin.delete("/admin/v1/pools/dash-pool").status_code == 204
    row = table.loc["dash-pool"]
    assert (row["found at"], row["method"], row["members"]) == (
        "dash-pool.invalid:8000",
        "plain",
        0,
    )
    assert row["discovery"].startswith("failing: ")


def test_teams_and_keys_creates_a_team_gives_it_a_key_and_shows_its_spend(
    dashboard_env: Stack,
) -> None:
    at = _run(_keys)
    at.text_input(key="team-name").set_value("dash-team")
    at.number_input(key="team-budget").set_value(20.0)
    at.number_input(key="team-weight").set_value(3.0)
    at.number_input(key="team-priority").set_value(-2)
    at.button(key="team-create").click().run()
    with dashboard_env.admin() as admin:
        [team] = [
            t for t in admin.get("/admin/v1/teams").json()["data"] if t["name"] == "dash-team"
        ]
    assert (team["budget_usd"], team["weight"], team["priority"]) == (20.0, 3.0, -2)
    assert at.success[0].value.startswith(f"Created team {team['id']} (dash-team)")
    at = _run(_keys)
    at.text_input(key="key-name").set_value("dash-team-key")
    at.selectbox(key="key-team").set_value("dash-team")
    at.button(key="key-create").click().run()
    with dashboard_env.admin() as admin:
        keys = admin.get("/admin/v1/keys").json()["data"]
        savings = admin.get("/admin/v1/savings", params={"group_by": "team"}).json()["data"]
    [key] = [k for k in keys if k["name"] == "dash-team-key"]
    assert key["team_id"] == team["id"]
    keys_table = at.dataframe[0].value.set_index("name")
    assert keys_table.loc["dash-team-key", "team"] == "dash-team"
    teams_table = next(
        d.value for d in at.dataframe if "team" in d.value.columns and "keys" in d.value.columns
    )
    row = teams_table.set_index("team").loc["dash-team"]
    assert (row["keys"], row["budget"], row["spent (30 days)"]) == (1, "$20.00", "$0.0000")
    assert (row["weight"], row["priority"]) == (3.0, -2)
    assert not [r for r in savings if r["team"] == team["id"]]  # no request of it yet
