"""Automatic method selection: cheapest at the current load, with hysteresis, dwell and audit."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from gateway.control.selector import Selector, decide
from gateway.db import migrate
from gateway.db.session import make_engine, make_sessionmaker
from gateway.db.tables import AuditEntry
from gateway.registry import BackendView, PolicyView, Registry, Snapshot
from planner.cost import ThroughputCurve

COSTS = {"plain": 1.0, "eagle3": 0.8, "p-eagle": 0.6}


@pytest.mark.parametrize(
    ("current", "costs", "since", "expected"),
    [
        (None, COSTS, 0.0, "p-eagle"),  # nothing chosen yet: take the cheapest
        ("plain", COSTS, 100.0, "p-eagle"),
        ("plain", COSTS, 10.0, None),  # dwell time not over
        ("eagle3", {"eagle3": 0.62, "p-eagle": 0.6}, 100.0, None),  # within the 5% margin
        ("p-eagle", COSTS, 100.0, None),  # already the cheapest
        ("dflash", COSTS, 0.0, "p-eagle"),  # current method no longer available: move at once
        ("plain", {}, 100.0, None),  # nothing measured
    ],
)
def test_decide(
    current: str | None, costs: dict[str, float], since: float, expected: str | None
) -> None:
    decision = decide(
        "m", current, costs, 4.0, since_switch_s=since, min_dwell_s=60, switch_margin=0.05
    )
    assert (decision.after if decision else None) == expected


def backend(name: str, method: str) -> BackendView:
    return BackendView(
        name, f"http://{name}", "m", method, 7 if method != "plain" else None, "B200", 1
    )


async def test_load_moves_the_model_and_the_move_is_audited(database_url: str) -> None:
    engine = make_engine(database_url)
    migrate.upgrade(engine)
    sessions = make_sessionmaker(engine)
    try:
        registry = Registry(sessions, refresh_s=60)
        # Speculation wins at low load; plain scales better at high load (the crossover).
        registry.snapshot = Snapshot(
            backends={"m": (backend("a", "plain"), backend("b", "p-eagle"))},
            policies={"m": PolicyView("auto")},
            prices={"B200": 6.0},
            curves={
                ("m", "plain", "B200"): ThroughputCurve((1, 64), (400, 20000)),
                ("m", "p-eagle", "B200"): ThroughputCurve((1, 64), (900, 15000)),
            },
        )
        selector = Selector(registry, sessions, interval_s=1, min_dwell_s=0, switch_margin=0.05)
        assert await selector.step() == []  # idle (c=1): already on the cheapest, p-eagle
        assert registry.auto_method("m", registry.snapshot) == "p-eagle"
        registry.states["a"].in_flight = registry.states["b"].in_flight = 32
        for _ in range(10):  # the moving average climbs towards 64
            await selector.step()
        assert registry.auto_method("m", registry.snapshot) == "plain"
        with sessions() as session:
            entries = session.scalars(select(AuditEntry).order_by(AuditEntry.id)).all()
        [entry] = entries
        assert (entry.actor, entry.action, entry.before, entry.resource_id) == (
            "auto",
            "switch",
            {"method": "p-eagle"},
            "m",
        )
        assert entry.after is not None
        assert entry.after["method"] == "plain"
        assert entry.after["concurrency"] > 16
        assert entry.after["usd_per_mtok"]["plain"] < entry.after["usd_per_mtok"]["p-eagle"]
    finally:
        engine.dispose()
