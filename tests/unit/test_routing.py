"""Routing: policy to method, fallback, power of two choices, breaker."""

from __future__ import annotations

import random
from collections import defaultdict

from gateway.registry import BackendState, BackendView, PolicyView
from gateway.relay.routing import route


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
