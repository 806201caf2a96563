"""Automatic method selection: cheapest at the current load, with hysteresis, dwell and audit."""

from __future__ import annotations

import dataclasses
import random

import pytest
from sqlalchemy import select, text
from sqlalchemy.orm import Session, sessionmaker

from gateway.acceptance import ClassPrice
from gateway.control.selector import PriceGauges, Selector, decide, kept_within
from gateway.curves import Band
from gateway.db import migrate
from gateway.db.session import make_engine, make_sessionmaker
from gateway.db.tables import AuditEntry
from gateway.metrics import GatewayMetrics
from gateway.policy.classes import ClassView, candidates
from gateway.registry import BackendView, PolicyView, Registry, Snapshot, auto_method
from gateway.relay.routing import choose_method
from gateway.services.rightsizing import Sizing
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


def crossover(
    sessions: sessionmaker[Session],
    policy: PolicyView | None = None,
    metrics: GatewayMetrics | None = None,
    load_window_s: float = 0.0,
) -> tuple[Registry, Selector]:
    """A model (auto unless `policy` says otherwise) on plain and P-EAGLE backends, and a
    selector without dwell: speculation wins at low load, plain scales better at high load
    (the crossover). With `metrics`, the selector publishes its prices there."""
    metrics = metrics or GatewayMetrics()
    registry = Registry(sessions, refresh_s=60)
    registry.snapshot = Snapshot(
        backends={"m": (backend("a", "plain"), backend("b", "p-eagle"))},
        policies={"m": policy or PolicyView("auto")},
        prices={"B200": 6.0},
        curves={
            ("m", "plain", "B200"): ThroughputCurve((1, 64), (400, 20000)),
            ("m", "p-eagle", "B200"): ThroughputCurve((1, 64), (900, 15000)),
        },
    )
    selector = Selector(
        registry,
        sessions,
        interval_s=1,
        min_dwell_s=0,
        switch_margin=0.05,
        sizing=Sizing(0.2, 1),
        desired_replicas=metrics.desired_replicas,
        prices=PriceGauges(metrics.method_usd_per_mtok, metrics.plain_usd_per_mtok),
        load_window_s=load_window_s,
    )
    return registry, selector


async def test_load_moves_the_model_and_the_move_is_audited(database_url: str) -> None:
    engine = make_engine(database_url)
    migrate.upgrade(engine)
    sessions = make_sessionmaker(engine)
    try:
        registry, selector = crossover(sessions)
        assert await selector.step() == []  # idle (c=1): already on the cheapest, p-eagle
        assert auto_method(registry.snapshot, registry.choices, "m") == "p-eagle"
        registry.states["a"].in_flight = registry.states["b"].in_flight = 32
        for _ in range(10):  # the moving average climbs towards 64
            await selector.step()
        assert auto_method(registry.snapshot, registry.choices, "m") == "plain"
        with sessions() as session:
            entries = session.scalars(select(AuditEntry).order_by(AuditEntry.id)).all()
        [start, entry] = entries  # the first round's choice (from the default), then the move
        assert (start.action, start.resource_id) == ("start", "m")
        assert start.before == {"method": "plain"}  # what routing served until the choice
        assert start.after is not None
        assert (start.after["method"], start.after["reason"]) == ("p-eagle", "start")
        assert start.after["usd_per_mtok"]["p-eagle"] < start.after["usd_per_mtok"]["plain"]
        assert (entry.actor, entry.action, entry.before, entry.resource_id) == (
            "auto",
            "switch",
            {"method": "p-eagle"},
            "m",
        )
        assert entry.after is not None
        assert entry.after["reason"] == "load"
        assert entry.after["method"] == "plain"
        assert entry.after["concurrency"] > 16
        assert entry.after["usd_per_mtok"]["plain"] < entry.after["usd_per_mtok"]["p-eagle"]
    finally:
        engine.dispose()


async def test_a_model_unpriced_at_start_serves_its_default_then_moves_at_once_audited(
    database_url: str,
) -> None:
    """No GPU price yet: the first choice is the default, audited with no candidates; once
    priced, the first priced choice is audited as a start too (the default was no choice:
    no move, at once, not gradual), and from then on moves go in steps."""
    engine = make_engine(database_url)
    migrate.upgrade(engine)
    sessions = make_sessionmaker(engine)
    try:
        registry, selector = crossover(sessions)
        selector.move_steps = (0.25, 15.0)
        priced = registry.snapshot
        registry.snapshot = dataclasses.replace(priced, prices={})
        await selector.step()
        assert auto_method(registry.snapshot, registry.choices, "m") == "plain"
        registry.snapshot = priced
        assert await selector.step() == []  # the first priced choice: a start, not a move
        assert auto_method(registry.snapshot, registry.choices, "m") == "p-eagle"
        assert "m" not in registry.choices.moves  # at once
        registry.states["a"].in_flight = registry.states["b"].in_flight = 32
        for _ in range(10):
            if await selector.step():
                break
        assert registry.choices.moves["m"].target == "plain"  # a priced move goes in steps
        with sessions() as session:
            entries = session.scalars(select(AuditEntry).order_by(AuditEntry.id)).all()
        start, first, move = [e for e in entries if e.action in ("start", "switch")]
        assert move.action == "switch"
        assert (start.action, start.before, start.after and start.after["method"]) == (
            "start",
            {"method": "plain"},
            "plain",
        )
        assert start.after is not None
        assert start.after["usd_per_mtok"] == {}
        assert (first.action, first.before) == ("start", {"method": "plain"})
        assert first.after is not None
        assert first.after["method"] == "p-eagle"
    finally:
        engine.dispose()


async def test_an_audit_the_database_refused_is_written_with_the_next_round(
    database_url: str,
) -> None:
    engine = make_engine(database_url)
    migrate.upgrade(engine)
    sessions = make_sessionmaker(engine)
    try:
        _, selector = crossover(sessions)
        with engine.begin() as connection:  # the audit log cannot be written for a while
            connection.execute(text("ALTER TABLE audit_log RENAME TO audit_log_away"))
        await selector.step()
        with engine.begin() as connection:
            connection.execute(text("ALTER TABLE audit_log_away RENAME TO audit_log"))
            assert connection.execute(text("SELECT count(*) FROM audit_log")).scalar() == 0
        await selector.step()
        with sessions() as session:
            entries = session.scalars(select(AuditEntry)).all()
        assert [(e.action, e.resource_id) for e in entries] == [("start", "m")]
        await selector.step()  # written once
        with sessions() as session:
            assert len(session.scalars(select(AuditEntry)).all()) == 1
    finally:
        engine.dispose()


async def test_desired_replicas_follow_the_smoothed_load_of_the_routed_pool(
    database_url: str,
) -> None:
    engine = make_engine(database_url)
    migrate.upgrade(engine)
    sessions = make_sessionmaker(engine)
    metrics = GatewayMetrics()
    try:
        registry = Registry(sessions, refresh_s=60)
        registry.snapshot = Snapshot(
            backends={"m": (backend("a", "plain"), backend("b", "p-eagle"))},
            policies={"m": PolicyView("pinned", method="p-eagle")},
            prices={"B200": 6.0},
            curves={
                ("m", "plain", "B200"): ThroughputCurve((1, 64), (400, 20000)),
                ("m", "p-eagle", "B200"): ThroughputCurve((1, 64), (900, 15000)),
            },
        )
        selector = Selector(
            registry,
            sessions,
            interval_s=1,
            min_dwell_s=0,
            switch_margin=0.05,
            sizing=Sizing(headroom=0.2, min_replicas=1, idle_pool_replicas=0),
            desired_replicas=metrics.desired_replicas,
        )

        def desired(method: str) -> float | None:
            labels = {"model": "m", "method": method}
            return metrics.registry.get_sample_value("draftgate_desired_replicas", labels)

        await selector.step()
        assert (desired("p-eagle"), desired("plain")) == (1, 0)  # idle: the floor, and 0
        # 64 streams on the p-eagle backend make 15000 tokens/s, a replica's most (no ITL
        # objective): with 20% headroom, ceil(18000 / 15000) = 2 replicas.
        registry.states["b"].in_flight = 64
        for _ in range(30):  # the moving average climbs to 15000 tokens/s
            await selector.step()
        assert (desired("p-eagle"), desired("plain")) == (2, 0)
        now = registry.choices.fleet_now["m"]
        assert now.routed_method == "p-eagle"
        assert now.output_tokens_per_s == pytest.approx(15000, rel=1e-3)
        assert now.desired_replicas == {"p-eagle": 2, "plain": 0}
        registry.states["b"].in_flight = 0
        for _ in range(30):  # and falls back
            await selector.step()
        assert desired("p-eagle") == 1
    finally:
        engine.dispose()


async def test_each_request_class_gets_its_objectives_choice(database_url: str) -> None:
    """Plain on cheap H100s, P-EAGLE on B200s at 10x the price and twice the speed: the
    latency class takes P-EAGLE, the cost class plain, a latency class capped below
    P-EAGLE's price the cheapest within its cap; each choice audited with its numbers."""
    engine = make_engine(database_url)
    migrate.upgrade(engine)
    sessions = make_sessionmaker(engine)
    try:
        registry = Registry(sessions, refresh_s=60)
        plain = BackendView("a", "http://a", "m", "plain", None, "H100", 1)
        classes = {
            "interactive": ClassView("latency"),
            "batch": ClassView("cost"),
            "thrifty": ClassView("latency", max_usd_per_mtok=5.0),
        }
        registry.snapshot = Snapshot(
            backends={"m": (plain, backend("b", "p-eagle"))},
            policies={"m": PolicyView("auto", classes=classes)},
            prices={"B200": 10.0, "H100": 1.0},
            curves={
                ("m", "plain", "H100"): ThroughputCurve((1, 64), (100, 3000)),
                ("m", "p-eagle", "B200"): ThroughputCurve((1, 64), (200, 6000)),
            },
        )
        selector = Selector(
            registry,
            sessions,
            interval_s=1,
            min_dwell_s=0,
            switch_margin=0.05,
            sizing=Sizing(0.2, 1),
            desired_replicas=GatewayMetrics().desired_replicas,
        )
        decisions = await selector.step()
        assert auto_method(registry.snapshot, registry.choices, "m", "interactive") == "p-eagle"
        assert auto_method(registry.snapshot, registry.choices, "m", "batch") == "plain"
        assert auto_method(registry.snapshot, registry.choices, "m", "thrifty") == "plain"
        assert (
            auto_method(registry.snapshot, registry.choices, "m") == "plain"
        )  # the policy's: cost
        assert {d.request_class for d in decisions} == {"interactive", "batch", "thrifty"}
        with sessions() as session:
            entries = session.scalars(select(AuditEntry).order_by(AuditEntry.id)).all()
        audited = {
            e.after["request_class"]: e.after
            for e in entries
            if e.after and "request_class" in e.after
        }
        assert audited["interactive"]["objective"] == "latency"
        assert (
            audited["interactive"]["itl_ms"]["p-eagle"] < audited["interactive"]["itl_ms"]["plain"]
        )
        assert audited["thrifty"]["usd_per_mtok"] == {"plain": pytest.approx(2.78, rel=0.01)}
        assert await selector.step() == []  # nothing moved: nothing new to audit
    finally:
        engine.dispose()


async def test_a_class_is_chosen_for_at_its_own_acceptance(database_url: str) -> None:
    """At 64 streams plain is 25% cheaper than P-EAGLE for the model's traffic; the `code`
    class accepts so much more of P-EAGLE's drafts that its tokens cost 0.7x the method's
    average there: it stays on P-EAGLE, audited at its own prices."""
    engine = make_engine(database_url)
    migrate.upgrade(engine)
    sessions = make_sessionmaker(engine)
    try:
        policy = PolicyView("auto", classes={"code": ClassView("cost")})
        registry, selector = crossover(sessions, policy)
        own = ClassPrice(0.7, 0.05, 4.6, 3.2, 500)
        registry.snapshot = dataclasses.replace(
            registry.snapshot, class_prices={("m", "p-eagle", "code"): own}
        )
        registry.states["a"].in_flight = registry.states["b"].in_flight = 32
        for _ in range(10):  # the moving average climbs towards 64
            await selector.step()
        assert auto_method(registry.snapshot, registry.choices, "m") == "plain"
        assert auto_method(registry.snapshot, registry.choices, "m", "code") == "p-eagle"
        with sessions() as session:
            entries = session.scalars(select(AuditEntry).order_by(AuditEntry.id)).all()
        model = [e.after for e in entries if e.after and e.after.get("method") == "plain"][-1]
        [code] = [e.after for e in entries if e.after and e.after.get("request_class") == "code"]
        assert code["usd_per_mtok"]["plain"] == pytest.approx(model["usd_per_mtok"]["plain"])
        assert code["usd_per_mtok"]["p-eagle"] < code["usd_per_mtok"]["plain"]
    finally:
        engine.dispose()


async def test_every_models_methods_are_priced_beside_plain_on_the_same_gpus(
    database_url: str,
) -> None:
    """A pinned model too: what the alert on a method costlier than plain reads. At c=1 on
    a $6 B200, P-EAGLE's 900 tokens/s cost 6 / (900 x 3600) x 1e6 = $1.85 per 1M, and plain
    on that backend's GPU (400 tokens/s) $4.17; a backend gone unhealthy is priced no more."""
    engine = make_engine(database_url)
    migrate.upgrade(engine)
    sessions = make_sessionmaker(engine)
    metrics = GatewayMetrics()
    try:
        registry, selector = crossover(sessions, PolicyView("pinned", method="p-eagle"), metrics)

        def priced(name: str) -> dict[str, float | None]:
            return {
                method: metrics.registry.get_sample_value(name, {"model": "m", "method": method})
                for method in ("plain", "p-eagle")
            }

        await selector.step()
        method, plain = "draftgate_method_usd_per_mtok", "draftgate_method_plain_usd_per_mtok"
        assert priced(method) == {
            "plain": pytest.approx(4.1667, rel=1e-4),
            "p-eagle": pytest.approx(1.8519, rel=1e-4),
        }
        assert priced(plain) == {
            "plain": pytest.approx(4.1667, rel=1e-4),
            "p-eagle": pytest.approx(4.1667, rel=1e-4),
        }
        registry.states["b"].healthy = False
        await selector.step()
        assert priced(method) == {"plain": pytest.approx(4.1667, rel=1e-4), "p-eagle": None}
        assert priced(plain)["p-eagle"] is None
    finally:
        engine.dispose()


def test_candidates_fall_back_to_the_nearest_when_none_is_within() -> None:
    costs, itls = {"plain": 1.0, "p-eagle": 2.0}, {"plain": 10.0, "p-eagle": 5.0}
    assert candidates(ClassView("cost", itl_objective_ms=4.0), costs, itls) == {"p-eagle": 2.0}
    assert candidates(ClassView("latency", max_usd_per_mtok=0.5), costs, itls) == {"plain": 10.0}
    assert candidates(ClassView("latency"), costs, itls) == itls
    assert candidates(ClassView("cost"), {}, {}) == {}


@pytest.mark.parametrize(("window_s", "moves"), [(0.0, 6), (3600.0, 1)])
async def test_a_load_window_holds_the_method_cheapest_for_the_burst_mix(
    database_url: str, window_s: float, moves: int
) -> None:
    """Bursts of 128 streams between rounds at 2: the moving average chases each (a move up
    and one down per burst); priced over the window, weighted by load, the bursts' tokens
    decide: plain, the cheaper at 128, once and for good."""
    engine = make_engine(database_url)
    migrate.upgrade(engine)
    sessions = make_sessionmaker(engine)
    try:
        registry, selector = crossover(sessions, load_window_s=window_s)
        curves = {  # plain cheaper past about 14.5 streams
            ("m", "plain", "B200"): ThroughputCurve((1, 8, 64), (400, 3000, 20000)),
            ("m", "p-eagle", "B200"): ThroughputCurve((1, 8, 64), (900, 5000, 15000)),
        }
        registry.snapshot = dataclasses.replace(registry.snapshot, curves=curves)
        assert await selector.step() == []  # idle: p-eagle, the cheaper at low load
        made = []
        for _ in range(3):
            for streams in (64,) * 8 + (1,) * 8:  # on each backend
                registry.states["a"].in_flight = registry.states["b"].in_flight = streams
                made += await selector.step()
        expected = ["plain", "p-eagle"] * 3 if moves == 6 else ["plain"]
        assert [d.after for d in made] == expected, [(d.after, d.concurrency) for d in made]
        if window_s:  # the audit says the load-weighted mean load it priced at
            assert made[0].concurrency > 64
    finally:
        engine.dispose()


def test_the_current_method_is_left_for_the_objective_only_once_surely_over_it() -> None:
    """At 6 ms, p-eagle estimated at 6.3 ms with a ±10% band may still be within: it stays
    a candidate (and, cheaper, the choice), so an estimate flickering across the objective
    moves nothing; at 7 ms, wholly over, it is left. A method enters on its estimate."""
    own = ClassView("cost", 6.0)
    costs = {"p-eagle": 0.50, "eagle3": 0.60, "dspark": 0.55}
    bands = {"p-eagle": 0.10, "eagle3": 0.02, "dspark": 0.10}
    near = {"p-eagle": 6.3, "eagle3": 5.0, "dspark": 6.2}
    scores = kept_within(candidates(own, costs, near), "p-eagle", own, costs, near, bands)
    assert scores == {"eagle3": 0.60, "p-eagle": 0.50}  # dspark, not current, must be within
    assert kept_within(candidates(own, costs, near), "eagle3", own, costs, near, bands) == {
        "eagle3": 0.60
    }
    over = {**near, "p-eagle": 7.0}
    assert kept_within(candidates(own, costs, over), "p-eagle", own, costs, over, bands) == {
        "eagle3": 0.60
    }
    latency = ClassView("latency", None, 1.0)  # a latency class has no ITL ceiling to keep
    assert kept_within(
        candidates(latency, costs, near), "p-eagle", latency, costs, near, bands
    ) == candidates(latency, costs, near)


def test_when_no_method_is_within_the_current_one_is_kept_beside_a_fastest_it_may_match() -> None:
    """In a burst every method is over 6 ms; p-eagle is the fastest by 2%, within the bands:
    eagle3, serving, stays a candidate beside it and, cheaper, the choice (before, it was
    left at once for p-eagle and taken back a round later). 30% slower, surely, it is left."""
    own = ClassView("cost", 6.0)
    costs = {"p-eagle": 0.66, "eagle3": 0.62}
    bands = {"p-eagle": 0.05, "eagle3": 0.05}
    burst = {"p-eagle": 7.0, "eagle3": 7.14}
    scores = kept_within(candidates(own, costs, burst), "eagle3", own, costs, burst, bands)
    assert scores == {"p-eagle": 0.66, "eagle3": 0.62}
    slower = {**burst, "eagle3": 9.1}
    assert kept_within(candidates(own, costs, slower), "eagle3", own, costs, slower, bands) == {
        "p-eagle": 0.66
    }


@pytest.mark.parametrize(("band", "kept"), [(0.10, True), (0.01, False)])
async def test_a_class_keeps_its_method_until_its_band_is_wholly_over_its_ceiling(
    database_url: str, band: float, kept: bool
) -> None:
    """A class with an ITL ceiling of its own chose P-EAGLE, the cheapest, at 1 stream; at 32
    its curve puts P-EAGLE 5% over the ceiling, where EAGLE-3 on dearer, faster GPUs is
    within (plain, slow here, is not). With a ±10% band P-EAGLE may still be within: the
    class stays (as the model's own objective does, `kept_within`); with ±1% it is surely
    over and moves to EAGLE-3."""
    engine = make_engine(database_url)
    migrate.upgrade(engine)
    sessions = make_sessionmaker(engine)
    try:
        registry, selector = crossover(sessions)
        fast = BackendView("c", "http://c", "m", "eagle3", 7, "H200", 1)
        snapshot = registry.snapshot
        ceiling = snapshot.itl_ms("m", "p-eagle", snapshot.backends["m"][1], 32) / 1.05
        classes = {"chat": ClassView("cost", itl_objective_ms=ceiling)}
        registry.snapshot = dataclasses.replace(
            snapshot,
            backends={"m": (*snapshot.backends["m"], fast)},
            policies={"m": PolicyView("auto", classes=classes)},
            prices={"B200": 6.0, "H200": 12.0},
            curves={
                **snapshot.curves,
                ("m", "plain", "B200"): ThroughputCurve((1, 64), (100, 3000)),
                ("m", "eagle3", "H200"): ThroughputCurve((1, 64), (1350, 22500)),
            },
            bands={
                ("m", m, g): Band((), band)
                for m, g in (("plain", "B200"), ("p-eagle", "B200"), ("eagle3", "H200"))
            },
        )
        await selector.step()
        assert auto_method(registry.snapshot, registry.choices, "m", "chat") == "p-eagle"
        for name in ("a", "b", "c"):
            registry.states[name].in_flight = 32 // 3 + (name == "a") * (32 % 3)
        for _ in range(30):  # the moving average climbs to 32
            await selector.step()
        chosen = auto_method(registry.snapshot, registry.choices, "m", "chat")
        assert chosen == ("p-eagle" if kept else "eagle3")
    finally:
        engine.dispose()


async def test_a_quarantined_method_is_left_at_once_and_never_chosen(database_url: str) -> None:
    """The lossless watchdog quarantines p-eagle, the cheapest at rest: `auto` leaves it in
    one step (not a gradual move: it changes answers) and does not come back while it is
    cheaper, nor explores it; lifted, it is chosen again."""
    engine = make_engine(database_url)
    migrate.upgrade(engine)
    sessions = make_sessionmaker(engine)
    try:
        registry, selector = crossover(sessions)
        selector.move_steps = (0.25, 15.0)
        await selector.step()
        assert auto_method(registry.snapshot, registry.choices, "m") == "p-eagle"
        free = registry.snapshot
        held = PolicyView("auto", explore_fraction=1.0, quarantined=frozenset({"p-eagle"}))
        registry.snapshot = dataclasses.replace(free, policies={"m": held})
        [decision] = await selector.step()
        assert (decision.before, decision.after) == ("p-eagle", "plain")
        assert "p-eagle" not in decision.usd_per_mtok  # not even a candidate
        assert "m" not in registry.choices.moves or registry.choices.moves["m"].done(0)
        for _ in range(3):
            assert await selector.step() == []
        assert auto_method(registry.snapshot, registry.choices, "m") == "plain"
        rng = random.Random(0)
        explored = {choose_method(held, "plain", {"plain", "p-eagle"}, rng) for _ in range(50)}
        assert explored == {("plain", False)}  # nothing else to explore
        registry.snapshot = free  # lifted
        [back] = await selector.step()
        assert back.after == "p-eagle"
    finally:
        engine.dispose()
