"""Gradual method moves: the step schedule, which requests move, and routing during a move."""

from __future__ import annotations

import random
from collections import Counter, defaultdict

import pytest

from gateway.policy.affinity import stable_hash
from gateway.policy.moves import Move, move_record, position_of, stored_move
from gateway.registry import BackendState, BackendView, PolicyView
from gateway.relay.routing import route

MOVE = Move("plain", "p-eagle", started=1000.0, step_share=0.25, step_s=15.0)
PLAIN = BackendView("a", "http://a", "m", "plain", None, "B200", 1)
PEAGLE = BackendView("p", "http://p", "m", "p-eagle", 7, "B200", 1)


@pytest.mark.parametrize(
    ("at", "share"),
    [(999.0, 0.25), (1000.0, 0.25), (1014.9, 0.25), (1015.0, 0.5), (1044.9, 0.75), (1045.0, 1.0)],
)
def test_the_target_takes_a_share_more_every_step(at: float, share: float) -> None:
    assert MOVE.share(at) == share
    assert MOVE.done(at) is (share == 1.0)


def test_steps_duration_and_odd_shares() -> None:
    assert (MOVE.steps_total, MOVE.duration_s) == (4, 45.0)
    third = Move("a", "b", 0.0, 0.4, 10.0)  # 0.4, 0.8, then all
    assert [third.share(t) for t in (0, 10, 20, 30)] == [0.4, 0.8, 1.0, 1.0]
    assert third.steps_total == 3
    assert Move("a", "b", 0.0, 1.0, 10.0).done(0.0)  # a step of everything: immediate
    assert Move("a", "b", 0.0, 0.5, 0.0).done(0.0)  # no time between steps: immediate


def test_a_session_keeps_its_side_and_sessions_split_by_the_share() -> None:
    keys = [stable_hash(b"s%d" % i) for i in range(2000)]
    moved = [MOVE.goes_to_target(1000.0, position_of(k, 0.99)) for k in keys]
    assert 400 <= sum(moved) <= 600  # a quarter of 2000
    # A session moved at the first step is still moved at every later one: it moves once.
    later = [MOVE.goes_to_target(1030.0, position_of(k, 0.0)) for k in keys]
    assert all(b for a, b in zip(moved, later, strict=True) if a)
    assert position_of(None, 0.3) == 0.3  # no key: the random draw


def test_a_stored_move_round_trips() -> None:
    record = move_record("plain", 1000.0, 0.25, 15.0)
    assert stored_move(record, "p-eagle") == MOVE
    assert stored_move(None, "p-eagle") is None


def test_routing_holds_back_a_request_the_move_has_not_reached() -> None:
    policy = PolicyView("pinned", "p-eagle", 7)
    table: defaultdict[str, BackendState] = defaultdict(BackendState)
    rng = random.Random(3)
    held = route((PLAIN, PEAGLE), policy, None, table, 0.0, rng, held_back=("p-eagle", "plain"))
    assert (held.method, held.backends[0]) == ("plain", PLAIN)
    served = Counter(
        route((PLAIN, PEAGLE), policy, None, table, 0.0, rng).backends[0].method for _ in range(5)
    )
    assert served == {"p-eagle": 5}
    # Held back from a target the policy does not choose: nothing changes.
    other = route((PLAIN, PEAGLE), policy, None, table, 0.0, rng, held_back=("eagle3", "plain"))
    assert other.method == "p-eagle"
