"""The Overview page against a real gateway with ledger data."""

from __future__ import annotations

from streamlit.testing.v1 import AppTest

from tests.dashboard.conftest import MODEL, Stack

TIMEOUT_S = 30.0


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
    table = at.dataframe[0].value
    assert set(table["model"]) == {MODEL}
    assert set(table["method"]) == {r["method"] for r in rows}
    captions = " ".join(c.value for c in at.caption)
    assert "B200 $" in captions
    assert "/GPU-h on-demand" in captions
