"""Routing, pure: model policy → method → the order in which to try its backends.

Every method is lossless, so when the chosen method has no healthy backend another method of
the same model serves the request (a fallback, reported). Within a method, a request with a
session key goes to the backend its key prefers unless that one is past its load bound
(gateway/policy/affinity.py: the backend most likely to hold its prefix in the KV cache); one
without, or on a fallback method, goes to the lighter of two random backends (power of two
choices). When no backend of the model looks healthy, every one is tried anyway (a panic
route, as Envoy's panic threshold does): probes and breakers judge from a distance, and an
overloaded fleet that answers late is better served slowly than refused whole.

A burst shorter than the selector's dwell time spills (`spill`): under `auto` with an ITL
objective, a request whose backend is already at the most streams its method serves within
the objective goes to the cheapest other method whose lightest backend still has room within
it, by the curves at each backend's live load. Spill never moves a rule's request, an
explored one, or a session its home backend's cache holds (named by a header or `user`, or
a later turn of a conversation: `Affinity.held`); the first turn of a conversation keyed only
by its opening may go. It is reported as the fallback `spill`.

Under a drafter trial (an A/B of two drafters of one method), the chosen method's backends
are split by drafter first: the request's side serves, the other side comes next.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter

from gateway.policy.affinity import Affinity, by_affinity
from gateway.policy.moves import position_of
from gateway.policy.rules import RuleView
from gateway.policy.trials import DrafterTrial
from gateway.registry import (
    BackendState,
    BackendView,
    PolicyView,
    Snapshot,
    auto_method,
    by_method,
)
from gateway.relay.exchange import Exchange

WAITING_WEIGHT = 2.0  # a queued request at the backend weighs more than one in flight
KV_WEIGHT = 4.0  # a full KV cache weighs like four requests in flight


@dataclass(frozen=True)
class Route:
    """Backends to try in order, the method chosen, and why another one serves, if so."""

    backends: tuple[BackendView, ...]
    method: str | None
    # why another method serves: "no_healthy_backend", or "spill" (the chosen one is full)
    fallback: str | None = None
    explored: bool = False
    panic: bool = False  # no backend looked healthy: all are tried
    # "home": the key's own backend; "spilled": it was full; "stored": the backend holding
    # the response a later turn continues (`previous_response_id`)
    affinity: str | None = None


def load(state: BackendState) -> float:
    """How busy a backend looks from here."""
    return state.in_flight + WAITING_WEIGHT * state.waiting + KV_WEIGHT * state.kv_usage


def choose_method(
    policy: PolicyView, auto_method: str | None, methods: set[str], rng: random.Random
) -> tuple[str | None, bool]:
    """The policy's method (pinned, or auto), or with `explore_fraction` another one (never
    one the lossless watchdog quarantined)."""
    chosen = policy.method if policy.mode == "pinned" else auto_method
    others = sorted(methods - {chosen} - policy.quarantined)
    if others and policy.explore_fraction and rng.random() < policy.explore_fraction:
        return rng.choice(others), True
    return chosen, False


def order_by_load(
    backends: Sequence[BackendView],
    states: Mapping[str, BackendState],
    rng: random.Random,
    limit: int | None = None,
) -> list[BackendView]:
    """Power of two choices for the first pick, then the rest by load (the first `limit`)."""
    if len(backends) <= 1:
        return list(backends)
    a, b = rng.sample(range(len(backends)), 2)
    first = a if load(states[backends[a].name]) <= load(states[backends[b].name]) else b
    rest = (x for i, x in enumerate(backends) if i != first)
    by_load = lambda x: load(states[x.name])  # noqa: E731
    ordered = (
        sorted(rest, key=by_load) if limit is None else heapq.nsmallest(limit - 1, rest, by_load)
    )
    return [backends[first], *ordered]


def route(
    backends: Sequence[BackendView],
    policy: PolicyView,
    auto_method: str | None,
    states: Mapping[str, BackendState],
    now: float,
    rng: random.Random,
    rule: RuleView | None = None,
    affinity: Affinity | None = None,
    held_back: tuple[str, str] | None = None,
    *,
    pools: Mapping[str, Sequence[BackendView]] | None = None,
    limit: int | None = None,
) -> Route:
    """Decide which backends serve one request of a model, in order of preference: the
    matching rule's method or else the policy's (at the rule's or pinned K first), then the
    model's other methods. Within the chosen method, by affinity when the request has a key.
    `held_back` (target, source): a gradual move has not reached this request yet, so the
    policy's choice of the target means the source, at any K.

    `pools` (the backends by method) and `limit` (how many will be tried) let a request
    read only the chosen method's pool while it has healthy members to fill the limit:
    routing time does not grow with the model's other pools."""
    pools = pools if pools is not None else by_method(backends)
    method: str | None
    if rule is not None:
        method, explored, k = rule.method, False, rule.k
    else:
        method, explored = choose_method(policy, auto_method, set(pools), rng)
        k = policy.k if policy.mode == "pinned" and not explored else None
        if held_back is not None and method == held_back[0] and not explored:
            method, k = held_back[1], None
    exact, near, others, panic = _candidates(pools, method, k, states, now, limit)
    exact, near = _trial_side(policy.drafter_trial, exact, near, affinity, rng)
    fallback = "no_healthy_backend" if not exact and not near and others else None
    home: str | None = None
    if affinity is not None and (exact or near):
        pool = exact or near
        ranked, kept = by_affinity(
            pool, affinity.key, attrgetter("seed"), lambda b: load(states[b.name]), affinity.balance
        )
        rest = near if exact else []
        ordered = [
            *ranked,
            *order_by_load(rest, states, rng, limit),
            *order_by_load(others, states, rng, limit),
        ]
        home = "home" if kept else "spilled"
    else:
        ordered = [
            x for group in (exact, near, others) for x in order_by_load(group, states, rng, limit)
        ]
    return Route(tuple(ordered[:limit]), method, fallback, explored, panic, home)


def _trial_side(
    trial: DrafterTrial | None,
    exact: list[BackendView],
    near: list[BackendView],
    affinity: Affinity | None,
    rng: random.Random,
) -> tuple[list[BackendView], list[BackendView]]:
    """Under a drafter trial, the request's side of the method's backends; the other side
    is tried next, before the method's other K (gateway/policy/trials.py)."""
    if trial is None or not exact:
        return exact, near
    key = affinity.key if affinity is not None else None
    side, other = trial.split(exact, attrgetter("drafter"), key, rng.random())
    return side, [*other, *near]


Candidates = tuple[list[BackendView], list[BackendView], list[BackendView], bool]


def _candidates(
    pools: Mapping[str, Sequence[BackendView]],
    method: str | None,
    k: int | None,
    states: Mapping[str, BackendState],
    now: float,
    limit: int | None,
) -> Candidates:
    """The healthy backends of `method` at K, at another K, and of the other methods (read
    only if the first two cannot fill `limit`), and whether none looked healthy (then every
    backend is a candidate: a panic route)."""
    own = [b for b in pools.get(method or "", ()) if states[b.name].available(now)]
    others: list[BackendView] = []
    if limit is None or len(own) < limit:
        others = [
            b
            for m, group in pools.items()
            if m != method
            for b in group
            if states[b.name].available(now)
        ]
    panic = not own and not others
    if panic:
        own = list(pools.get(method or "", ()))
        others = [b for m, group in pools.items() if m != method for b in group]
    exact = [b for b in own if k is None or b.k == k]
    near = [b for b in own if k is not None and b.k != k]  # another K
    return exact, near, others, panic


def route_request(
    x: Exchange,
    states: Mapping[str, BackendState],
    rng: random.Random,
    now: float,
    wall: float,
    limit: int | None = None,
    *,
    spill: bool = False,
) -> Route:
    """Route one request by what it captured (its snapshot and the selector's choices), its
    model, class, rule and session key, at `now` (monotonic) and `wall` (epoch seconds);
    past its method's room within the objective, to another method's (`spill`)."""
    snapshot, model = x.snapshot, x.model
    assert snapshot is not None
    assert model is not None
    if x.home is not None:  # a later turn: only the backend holding the conversation can
        return Route((x.home,), x.home.method, affinity="stored")
    if x.pinned is not None:  # a watchdog's replay: its reference method's backends alone
        pool = snapshot.pools[model].get(x.pinned, ())
        healthy = [b for b in pool if states[b.name].available(now)]
        return Route(tuple(order_by_load(healthy, states, rng, limit)), x.pinned)
    policy = snapshot.policies.get(model) or PolicyView()
    own = x.request_class if x.request_class in policy.classes else None
    chosen = auto_method(snapshot, x.choices, model, own)
    held_back = None
    move = policy.move if policy.mode == "pinned" else x.choices.moves.get(model)
    if x.rule is None and move is not None and not move.done(wall):
        # a gradual move: this request's place says which side serves it
        key = x.affinity.key if x.affinity is not None else None
        if not move.goes_to_target(wall, position_of(key, rng.random())):
            held_back = (move.target, move.source)
    backends, pools = snapshot.backends[model], snapshot.pools[model]
    plan = route(
        backends,
        policy,
        chosen,
        states,
        now,
        rng,
        x.rule,
        x.affinity,
        held_back,
        pools=pools,
        limit=limit,
    )
    objective = policy.classes[own].itl_objective_ms if own else policy.itl_objective_ms
    if not spill or policy.mode != "auto" or x.rule is not None or objective is None:
        return plan
    held = x.affinity is not None and x.affinity.held
    return spilled(plan, snapshot, model, objective, states, now, held, policy.quarantined)


def streams(state: BackendState) -> float:
    """The requests a backend is serving now: this process's in flight, or every replica's
    as last scraped (smoothed), whichever is more."""
    return max(float(state.in_flight), state.scraped_running or 0.0)


def spilled(
    plan: Route,
    snapshot: Snapshot,
    model: str,
    objective_ms: float,
    states: Mapping[str, BackendState],
    now: float,
    held: bool = False,
    quarantined: frozenset[str] = frozenset(),
) -> Route:
    """`plan`, or, when its first backend has no room left within the objective, the same
    request led by the lightest backend of the cheapest other method that has (None of
    them: `plan` as it is, slow rather than refused), never a `quarantined` one. A session
    its home backend's cache holds (`held`, and routed home) stays."""
    if plan.explored or plan.fallback or plan.panic or not plan.backends:
        return plan
    if held and plan.affinity == "home":
        return plan
    first = plan.backends[0]
    room = snapshot.streams_within(model, first.method, first, objective_ms)
    if room is None or streams(states[first.name]) + 1 <= room:
        return plan  # the common case: one comparison
    best, best_usd = None, math.inf
    for method, pool in snapshot.pools[model].items():
        if method == first.method or method in quarantined:
            continue
        healthy = [b for b in pool if states[b.name].available(now)]
        if not healthy:
            continue
        lightest = min(healthy, key=lambda b: streams(states[b.name]))
        load = streams(states[lightest.name]) + 1
        within = snapshot.streams_within(model, method, lightest, objective_ms)
        usd = snapshot.usd_per_mtok(model, method, lightest, load)
        if within is not None and load <= within and usd is not None and usd < best_usd:
            best, best_usd = lightest, usd
    if best is None:
        return plan
    rest = tuple(b for b in plan.backends if b is not best)[: len(plan.backends) - 1]
    return Route((best, *rest), best.method, "spill", affinity=plan.affinity)
