"""Routing: policy to method, fallback, power of two choices, breaker."""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import replace

from gateway.policy.affinity import Affinity
from gateway.policy.trials import DrafterTrial
from gateway.registry import BackendState, BackendView, PolicyView, Snapshot
from gateway.relay.routing import route, spilled
from planner.cost import ThroughputCurve


def backend(name: str, method: str) -> BackendView:
    return BackendView(name, f"http://{name}", "m", method, None, "B200", 1)


PLAIN_A, PLAIN_B, PEAGLE = backend("a", "plain"), backend("b", "plain"), backend("p", "p-eagle")
ALL = (PLAIN_A, PLAIN_B, PEAGLE)


def states(**overrides: BackendState) -> defaultdict[str, BackendState]:
    table: defaultdict[str, BackendState] = defaultdict(BackendState)
    table.update(overrides)
    return table


def test_pinned_method_goes_first_then_the_others() -> None:
    plan = route(ALL, PolicyView("pinned", "p-eagle"), "plain", states(), 0.0, random.Random(1))
    assert plan.backends[0] == PEAGLE
    assert set(plan.backends[1:]) == {PLAIN_A, PLAIN_B}
    assert (plan.method, plan.fallback) == ("p-eagle", None)


def test_auto_uses_the_registry_choice() -> None:
    plan = route(ALL, PolicyView(), "p-eagle", states(), 0.0, random.Random(1))
    assert plan.backends[0] == PEAGLE


def test_unhealthy_or_open_breaker_backends_are_skipped_with_a_fallback() -> None:
    down = states(p=BackendState(healthy=False))
    plan = route(ALL, PolicyView("pinned", "p-eagle"), None, down, 0.0, random.Random(1))
    assert PEAGLE not in plan.backends
    assert plan.fallback == "no_healthy_backend"
    tripped = states(p=BackendState(open_until=10.0))
    assert (
        PEAGLE
        not in route(
            ALL, PolicyView("pinned", "p-eagle"), None, tripped, 5.0, random.Random(1)
        ).backends
    )
    assert (
        PEAGLE
        in route(
            ALL, PolicyView("pinned", "p-eagle"), None, tripped, 10.0, random.Random(1)
        ).backends
    )


def test_nothing_healthy_means_every_backend_is_tried_in_panic() -> None:
    dead = states(**{b.name: BackendState(healthy=False) for b in ALL})
    plan = route(ALL, PolicyView("pinned", "p-eagle"), None, dead, 0.0, random.Random(1))
    assert plan.panic
    assert plan.backends[0] == PEAGLE
    assert set(plan.backends) == set(ALL)
    some = states(a=BackendState(healthy=False))
    assert not route(ALL, PolicyView(), "plain", some, 0.0, random.Random(1)).panic


def test_two_choices_prefers_the_lighter_backend() -> None:
    busy = states(a=BackendState(in_flight=10), b=BackendState(in_flight=0))
    firsts = [
        route((PLAIN_A, PLAIN_B), PolicyView(), "plain", busy, 0.0, random.Random(seed)).backends[0]
        for seed in range(50)
    ]
    assert set(firsts) == {PLAIN_B}


def test_scraped_queue_and_kv_usage_count_as_load() -> None:
    queued = states(a=BackendState(waiting=5), b=BackendState(in_flight=3))
    plan = route((PLAIN_A, PLAIN_B), PolicyView(), "plain", queued, 0.0, random.Random(3))
    assert plan.backends[0] == PLAIN_B


def test_explore_fraction_sends_some_traffic_to_other_methods() -> None:
    policy = PolicyView("pinned", "plain", explore_fraction=0.25)
    rng = random.Random(7)
    explored = [route(ALL, policy, None, states(), 0.0, rng) for _ in range(2000)]
    share = sum(p.explored for p in explored) / len(explored)
    assert 0.2 < share < 0.3
    assert all(p.backends[0] == PEAGLE for p in explored if p.explored)


def test_a_pinned_k_serves_first_then_the_method_at_another_k() -> None:
    k3 = BackendView("e3", "http://e3", "m", "eagle3", 3, "B200", 1)
    k5 = BackendView("e5", "http://e5", "m", "eagle3", 5, "B200", 1)
    fleet = (k5, k3, PLAIN_A)
    for seed in range(20):
        pinned = route(
            fleet, PolicyView("pinned", "eagle3", 3), None, states(), 0.0, random.Random(seed)
        )
        assert pinned.backends == (k3, k5, PLAIN_A)
    down = states(e3=BackendState(healthy=False))
    plan = route(fleet, PolicyView("pinned", "eagle3", 3), None, down, 0.0, random.Random(1))
    assert (plan.backends, plan.fallback) == ((k5, PLAIN_A), None)  # same method: no fallback
    auto = {
        route(fleet, PolicyView(), "eagle3", states(), 0.0, random.Random(s)).backends[0]
        for s in range(20)
    }
    assert auto == {k3, k5}  # auto has no K: both replicas of the method share its load


def test_a_request_reads_only_its_pool_while_it_has_enough_healthy_members() -> None:
    """With the pools and the attempts a request may make, routing orders only what it will
    try: the chosen pool's healthy members first, the other pools only to fill the limit,
    every backend in panic; the same method, fallback and panic as the whole ordering."""
    from gateway.registry import by_method

    rng = random.Random(7)
    for _ in range(200):
        fleet = [backend(f"p{i}", "p-eagle") for i in range(rng.randint(0, 6))]
        fleet += [
            backend(f"o{i}", rng.choice(["plain", "dflash"])) for i in range(rng.randint(1, 40))
        ]
        table = states(**{b.name: BackendState(healthy=rng.random() < 0.6) for b in fleet})
        policy = PolicyView("pinned", "p-eagle")
        limit = rng.randint(1, 4)
        whole = route(fleet, policy, None, table, 0.0, random.Random(1))
        plan = route(
            fleet, policy, None, table, 0.0, random.Random(1), pools=by_method(fleet), limit=limit
        )
        assert (plan.method, plan.fallback, plan.panic) == (
            whole.method,
            whole.fallback,
            whole.panic,
        )
        assert len(plan.backends) == min(limit, len(whole.backends))
        healthy_own = [b for b in fleet if b.method == "p-eagle" and table[b.name].healthy]
        own_first = min(limit, len(healthy_own)) if not plan.panic else 0
        assert set(plan.backends[:own_first]) <= set(healthy_own)
        if not plan.panic:
            assert all(table[b.name].healthy for b in plan.backends)
        # what follows the pool's members is the lightest of the rest
        rest = [b for b in plan.backends[own_first:] if b.method != "p-eagle"]
        assert len(set(rest)) == len(rest)


def spill_snapshot() -> Snapshot:
    """p-eagle fast at low load and slow at high; eagle3 scales further; plain dearest."""
    line = lambda low, high: ThroughputCurve((1.0, 64.0), (low, high))  # noqa: E731
    curves = {
        ("m", "p-eagle", "B200"): line(400.0, 6400.0),  # 2.5 ms ITL at 1 stream, 10 at 64
        ("m", "eagle3", "B200"): line(300.0, 12800.0),  # 3.3 ms, 5 ms
        ("m", "plain", "B200"): line(200.0, 11000.0),  # 5 ms, 5.8 ms
    }
    backends = (PEAGLE, backend("e", "eagle3"), PLAIN_A)
    return Snapshot(backends={"m": backends}, prices={"B200": 4.5}, curves=curves)


def test_a_request_spills_only_past_its_methods_room_within_the_objective() -> None:
    snapshot = spill_snapshot()
    room = snapshot.streams_within("m", "p-eagle", PEAGLE, 6.0)
    assert room is not None
    assert 1 < room < 64
    assert snapshot.itl_ms("m", "p-eagle", PEAGLE, room) <= 6.0  # type: ignore[operator]
    assert snapshot.itl_ms("m", "p-eagle", PEAGLE, room + 1) > 6.0  # type: ignore[operator]
    plan = route(snapshot.backends["m"], PolicyView(), "p-eagle", states(), 0.0, random.Random(1))
    assert plan.backends[0] == PEAGLE
    roomy = states(p=BackendState(in_flight=room - 1))  # this request makes `room`
    assert spilled(plan, snapshot, "m", 6.0, roomy, 0.0) is plan
    full = states(p=BackendState(in_flight=room))
    moved = spilled(plan, snapshot, "m", 6.0, full, 0.0)
    # eagle3 and plain both have room; eagle3 is cheaper at its load
    assert (moved.backends[0].method, moved.method, moved.fallback) == ("eagle3", "eagle3", "spill")
    assert PEAGLE in moved.backends[1:]  # still tried should eagle3 fail before answering
    scraped = states(p=BackendState(in_flight=0, scraped_running=float(room)))  # other replicas'
    assert spilled(plan, snapshot, "m", 6.0, scraped, 0.0).fallback == "spill"


def test_no_spill_for_a_session_its_cache_holds_or_when_no_method_has_room() -> None:
    snapshot = spill_snapshot()
    room = snapshot.streams_within("m", "p-eagle", PEAGLE, 6.0) or 0
    plan = route(snapshot.backends["m"], PolicyView(), "p-eagle", states(), 0.0, random.Random(1))
    full = states(p=BackendState(in_flight=room))
    home = replace(plan, affinity="home")
    assert spilled(home, snapshot, "m", 6.0, full, 0.0, held=True) is home
    # a first turn keyed only by its opening holds nothing in a cache yet: it may go
    assert spilled(home, snapshot, "m", 6.0, full, 0.0).fallback == "spill"
    everyone_full = states(
        p=BackendState(in_flight=room),
        e=BackendState(in_flight=4096),
        a=BackendState(in_flight=4096),
    )
    assert spilled(plan, snapshot, "m", 6.0, everyone_full, 0.0) is plan  # slow, not refused
    down = states(p=BackendState(in_flight=room), e=BackendState(healthy=False))
    assert spilled(plan, snapshot, "m", 6.0, down, 0.0).backends[0] == PLAIN_A


def test_a_drafter_trial_sends_its_share_to_its_drafter_and_keeps_a_session_on_a_side() -> None:
    old = [replace(backend(f"o{i}", "p-eagle"), drafter="old") for i in range(3)]
    new = replace(backend("n", "p-eagle"), drafter="new")
    pool = (*old, new, PLAIN_A)
    policy = PolicyView("pinned", "p-eagle", drafter_trial=DrafterTrial("new", 0.25))
    rng = random.Random(7)
    plans = [route(pool, policy, None, states(), 0.0, rng) for _ in range(4000)]
    share = sum(p.backends[0] == new for p in plans) / len(plans)
    assert 0.22 < share < 0.28  # 0.25 +- 4.4 standard errors
    # the other side comes next, then the other methods
    assert all(set(p.backends[:4]) == {*old, new} and p.backends[4] == PLAIN_A for p in plans)
    # a session's requests all go to one side: its key's place, not a draw
    sides = {
        key: {
            route(pool, policy, None, states(), 0.0, rng, affinity=Affinity(key, 1.25)).backends[0]
            == new
            for _ in range(20)
        }
        for key in range(200)
    }
    assert all(len(side) == 1 for side in sides.values())
    assert 0.15 < sum(True in side for side in sides.values()) / len(sides) < 0.35
    # the trial's side down: its requests go to the other side
    down = states(n=BackendState(healthy=False))
    assert all(route(pool, policy, None, down, 0.0, rng).backends[0] in old for _ in range(100))
    # no backend of the trial's drafter: the trial does nothing
    alone = route((*old, PLAIN_A), policy, None, states(), 0.0, rng)
    assert (set(alone.backends[:3]), alone.fallback) == (set(old), None)
