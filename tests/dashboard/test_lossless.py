"""The Methods page's lossless panel: the watchdog's checks, seeded in the stack's database,
read back through GET /admin/v1/lossless and shown beside the floor."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from dashboard.client import refresh_reads
from dashboard.formats import share, usd
from dashboard.widgets.periods import period_start
from gateway.accounting import write_batch
from gateway.db.session import make_engine, make_sessionmaker, transaction
from gateway.db.tables import LosslessCheck
from gateway.ledger_entry import UsageEntry
from tests.api.test_admin_lossless import check
from tests.dashboard.conftest import MODEL, Stack

TIMEOUT_S = 30.0
DSPARK: dict[str, Any] = {"method": "dspark", "k": 7, "backend_name": "demo-dspark"}
EAGLE3: dict[str, Any] = {
    "method": "eagle3",
    "k": 3,
    "drafter": "RedHatAI/gpt-oss-20b-speculator.eagle3",
    "backend_name": "demo-eagle3",
}


def _check(n: int, prefix: int | None = None, **changes: object) -> LosslessCheck:
    """Answer `n` checked minutes ago: it diverged at token `prefix` when one is given."""
    ago = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1 + n % 20)
    where = {"model": MODEL, "backend_name": "demo-plain", "reference_backend": "demo-plain"}
    return check(n, prefix=prefix, **({"created_at": ago} | where | changes))


def _checks() -> list[LosslessCheck]:
    floor = [_check(n, prefix=(17, 21)[n] if n < 2 else None) for n in range(50)]  # 2 of 50
    positions = [5] * 10 + [6, 9]  # 12 of 40 from token 5: a broken verify path's pattern
    dspark = [
        _check(100 + n, prefix=positions[n] if n < len(positions) else None, **DSPARK)
        for n in range(40)
    ]
    eagle3 = [_check(200 + n, **EAGLE3) for n in range(30)]  # none of 30
    return floor + dspark + eagle3


def _replay(cost_usd: float | None) -> UsageEntry:
    return UsageEntry(
        request_id=f"lossless-{uuid.uuid4().hex}",
        client_request_id=None,
        created_at=dt.datetime.now(dt.UTC) - dt.timedelta(minutes=2),
        api_key_id=None,
        model=MODEL,
        method="plain",
        backend_name="demo-plain",
        prompt_tokens=12,
        completion_tokens=24,
        status_code=200,
        outcome="ok",
        latency_ms=40.0,
        ttft_ms=4.0,
        concurrency=1.0,
        cost_usd=cost_usd,
        baseline_cost_usd=cost_usd,
        request_class="lossless-replay",
    )


@pytest.fixture(scope="module")
def seeded(stack: Stack) -> None:
    """120 checks of the demo model and 4 replays (one unpriced), in the gateway's database."""
    engine = make_engine(stack.database_url)
    try:
        sessions = make_sessionmaker(engine)
        with transaction(sessions) as session:
            session.add_all(_checks())
        write_batch(sessions, [_replay(0.002), _replay(0.002), _replay(0.002), _replay(None)])
    finally:
        engine.dispose()


def _methods() -> None:
    from dashboard.app_pages import methods

    methods.render()


def _panel_of_an_unchecked_model() -> None:
    from dashboard.app_pages import methods
    from dashboard.client import admin_client

    methods._lossless(admin_client(), "org/never-checked")


def _rate(found: dict[str, Any]) -> str:
    low, high = found["interval_95"]
    return f"{share(found['divergence_rate'])} (95%: {share(low)} to {share(high)})"


def _report(stack: Stack) -> dict[str, Any]:
    """The API's report of the demo model over the page's period."""
    params = {"model": MODEL, "from": period_start("30 days").isoformat()}
    with stack.admin() as admin:
        response = admin.get("/admin/v1/lossless", params=params)
    assert response.status_code == 200, response.text
    [found] = response.json()["models"]
    assert found["model"] == MODEL
    return dict(found)


def test_the_lossless_panel_names_the_floor_beside_each_rate(
    seeded: None, dashboard_env: Stack
) -> None:
    found = _report(dashboard_env)
    floor, replays = found["floor"], found["replays"]
    by_method = {g["method"]: g for g in found["groups"]}
    dspark = by_method["dspark"]
    assert (floor["divergences"], floor["samples"]) == (2, 50)  # the seeded rows, as counted
    assert (dspark["divergences"], dspark["samples"]) == (12, 40)
    assert (by_method["eagle3"]["divergences"], by_method["eagle3"]["samples"]) == (0, 30)
    assert (replays["requests"], replays["unpriced"]) == (4, 1)
    refresh_reads()  # the page reads afresh, not from a cache of an earlier test
    at = AppTest.from_function(_methods, default_timeout=TIMEOUT_S).run()
    assert not at.exception
    assert not at.error, [e.value for e in at.error]
    sentence = (
        f"120 answers checked against plain: dspark K=7 changed 12 of 40 greedy answers "
        f"({_rate(dspark)}); the floor (plain against plain) is 2 of 50 ({_rate(floor)})."
    )
    assert sentence in [m.value for m in at.markdown]
    table = next(d.value for d in at.dataframe if "rate (95% interval)" in d.value.columns)
    assert list(table["method"]) == ["plain", "dspark", "eagle3"]  # the floor first
    assert list(table["against"]) == ["plain (the floor)", "plain", "plain"]
    assert list(table["checks"]) == [50, 40, 30]
    assert list(table["by token ids"]) == [50, 40, 30]  # the seeded checks compared tokens
    assert list(table["rate (95% interval)"]) == [_rate(g) for g in found["groups"]]
    first = dspark["first_divergence"]
    assert (first["min"], first["p50"], first["max"]) == (5, 5.0, 9)
    shown = ["median 19 tokens (17 to 21)", "median 5 tokens (5 to 9)", "—"]
    assert list(table["first divergence"]) == shown
    captions = [c.value for c in at.caption]
    cost = f"4 replays, {usd(replays['cost_usd'])} (a capacity cost, priced like any request)"
    assert f"{cost}; 1 without a price, not in it" in captions
    assert usd(replays["cost_usd"]) == "$0.0060"


def test_the_lossless_panel_says_how_to_turn_the_watchdog_on(dashboard_env: Stack) -> None:
    at = AppTest.from_function(_panel_of_an_unchecked_model, default_timeout=TIMEOUT_S).run()
    assert not at.exception
    assert not at.dataframe
    [caption] = [c.value for c in at.caption]
    assert caption.startswith("No lossless checks of this model in the period: the watchdog")
    assert "`DRAFTGATE_LOSSLESS_SAMPLE_SHARE`" in caption
    assert "docs/lossless.md" in caption
