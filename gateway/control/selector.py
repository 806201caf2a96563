"""Automatic method selection: for `auto` models, the method that is cheapest at the current load.

Every `selector_interval_s` the selector averages each auto model's in-flight requests (an
exponential moving average), prices every method with a healthy backend at that concurrency
from the measured throughput curves, and moves the model to the cheapest one. With a load
window (`selector_load_window_s`), it prices each method over the window's samples instead,
each weighted by its load (the tokens it asks for, in proportion): the method cheapest for
the load mix of the last window, so bursts shorter than the dwell time do not make it chase
each one a round late. It moves — only when it
is cheaper by more than `switch_margin` (hysteresis) and the model has stayed on its method
for `min_dwell_s`; a method that misses the ITL objective is left at once, but the method
serving misses it only once its curve's 95% band is wholly over it (`kept_within`).
Routing serves exactly what the selector chose: until its first round
(at once when it starts) a model serves its default (plain, or its first method by name),
and that first choice is audited too (action `start`, with the candidates' prices and the
default it replaces; a first choice made with no price keeps the default until the first
priced one, a start too). Each move is written to the audit log with the numbers behind it, and
goes in steps (gateway/policy/moves.py: `move_step_share` of the traffic every `move_step_s`);
each step of every move under way, the selector's and an admin's, is audited as it is
reached (within one interval).

The same round sizes every model's method pools for its current load (the autoscaling
signal `draftgate_desired_replicas{model,method}`): the output tokens/s the model's
backends deliver at their in-flight counts, smoothed like the load, over what one replica
of the routed method serves within the ITL objective, with `sizing_headroom` to spare;
pools the policy does not route to now want `idle_pool_replicas`. Because the routed method
moves only with the selector's margin and dwell time, so does the signal.

Every round also publishes, for every model (pinned ones too), each method's $/1M at the
model's current load beside plain decoding's on the same GPUs at the same load
(`draftgate_method_usd_per_mtok`, `draftgate_method_plain_usd_per_mtok`): what the alert
on a method costing more than plain reads.

A request class with an objective of its own is chosen for at its own prices: where it has
enough reports of its own acceptance (gateway/acceptance.py), each method's $/1M and ITL
scaled by the method's acceptance over the class's; else the method's. A class's method is
kept within its ITL ceiling by the same band as the model's (`kept_within`).
"""

# Over 400 lines: one control round from load average to published choices, prices and
# desired replicas, whose state (averages, dwell, moves) only it keeps; `decide` is pure.

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from prometheus_client import Gauge
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from gateway.db.session import transaction
from gateway.events.webhooks import WebhookSender, method_moved
from gateway.metrics import set_exactly
from gateway.policy.choices import Choices
from gateway.policy.classes import ClassView, candidates
from gateway.policy.moves import Move
from gateway.registry import BackendView, PolicyView, Registry, Snapshot
from gateway.schemas.reports import FleetNow
from gateway.services.models import record_method_switch, record_move_step
from gateway.services.rightsizing import Sizing, pools
from planner.rightsize import replica_capacity, replicas_needed

logger = logging.getLogger(__name__)
EMA_WEIGHT = 0.3  # weight of the newest sample in the load average
ACTOR = "auto"
MAX_UNAUDITED_ROUNDS = 100  # rounds of audits kept for a database that does not answer


@dataclass(frozen=True)
class Decision:
    """A move of one model to another method, and why."""

    model: str
    before: str | None
    after: str
    concurrency: float
    usd_per_mtok: Mapping[str, float]
    itl_ms: Mapping[str, float] = field(default_factory=dict)
    request_class: str | None = None  # a class with an objective of its own, or the model's
    objective: str = "cost"


@dataclass(frozen=True)
class _Chosen:
    """A round's working copy of the choices, published whole when the round ends."""

    auto: dict[str, str]
    classes: dict[tuple[str, str], str]
    moves: dict[str, Move]


@dataclass(frozen=True)
class _Audit:
    """One round's entries for the audit log."""

    starts: list[Decision]  # a model's first choice on this replica (after the default)
    decisions: list[Decision]  # moves the load made
    steps: list[tuple[str, Move, int]]  # steps of gradual moves reached


@dataclass(frozen=True)
class PriceGauges:
    """Where the selector publishes each method's price and plain's beside it."""

    method: Gauge
    plain: Gauge


def decide(
    model: str,
    current: str | None,
    costs: Mapping[str, float],
    concurrency: float,
    *,
    since_switch_s: float,
    min_dwell_s: float,
    switch_margin: float,
) -> Decision | None:
    """The move to make now, if any (pure)."""
    if not costs:
        return None
    best = min(costs, key=costs.__getitem__)
    if best == current:
        return None
    if current is not None and current in costs:
        if since_switch_s < min_dwell_s:
            return None
        if costs[best] > costs[current] * (1 - switch_margin):
            return None
    return Decision(model, current, best, concurrency, dict(costs))


class Selector:
    """The control loop that keeps each `auto` model on its cheapest method."""

    def __init__(
        self,
        registry: Registry,
        sessions: sessionmaker[Session],
        *,
        interval_s: float,
        min_dwell_s: float,
        switch_margin: float,
        sizing: Sizing,
        desired_replicas: Gauge,
        move_steps: tuple[float, float] = (1.0, 0.0),
        webhooks: WebhookSender | None = None,  # told of each move, with its candidates
        prices: PriceGauges | None = None,
        in_flight: Callable[[], Mapping[str, float] | None] | None = None,
        queued: Callable[[], Mapping[str, float]] | None = None,
        load_window_s: float = 0.0,
    ) -> None:
        self.webhooks = webhooks
        # Requests in flight per backend over the replica's worker processes (None: this
        # process's own counts, which are the replica's with one worker).
        self.in_flight = in_flight or (lambda: None)
        # Requests waiting in each model's fair-share queue: demand its backends did not
        # take yet, counted in its load and throughput, so sizing sees it
        self.queued = queued or (lambda: {})
        self.registry, self.sessions = registry, sessions
        self.interval_s, self.min_dwell_s, self.switch_margin = (
            interval_s,
            min_dwell_s,
            switch_margin,
        )
        self.sizing, self.desired_replicas = sizing, desired_replicas
        self._load: dict[str, float] = {}
        self.load_window_s = load_window_s  # 0: price at the moving average alone
        self._samples: dict[str, deque[tuple[float, float]]] = {}  # (when, in flight)
        self._throughput: dict[str, float] = {}
        self._switched_at: dict[tuple[str, str | None], float] = {}
        self.move_steps = move_steps  # (share per step, seconds between steps)
        self._steps_seen: dict[str, tuple[Move, int]] = {}  # the last step audited per model
        self._unpriced: set[str] = set()  # auto models on their default until priced
        self._unaudited: list[_Audit] = []  # audits a database error kept back, oldest first
        self.prices = prices

    async def run(self, stop: asyncio.Event) -> None:
        """Decide at once (the first choices: routing serves its default until then), then
        on an interval until `stop`."""
        while not stop.is_set():
            await self.step()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval_s)

    async def step(self) -> list[Decision]:
        """One round over every auto model; its choices are published whole at the end."""
        snapshot, now = self.registry.snapshot, time.monotonic()
        was = self.registry.choices
        chosen = _Chosen(dict(was.auto), dict(was.classes), dict(was.moves))
        in_flight, queued = self.in_flight(), self.queued()
        if in_flight is None:
            in_flight = {name: state.in_flight for name, state in self.registry.states.items()}
        starts: list[Decision] = []
        decisions: list[Decision] = []
        for model, backends in snapshot.backends.items():
            policy = snapshot.policies.get(model)
            model_in_flight = sum(in_flight.get(b.name, 0) for b in backends)
            waiting = queued.get(model, 0.0)
            load = self._smooth(self._load, model, model_in_flight + waiting)
            loads = self._window(model, model_in_flight + waiting, load, now)
            delivering = self._delivering(snapshot, model, backends, in_flight)
            if waiting and model_in_flight:  # the waiting at the rate each stream gets now
                delivering *= (model_in_flight + waiting) / model_in_flight
            self._smooth(self._throughput, model, delivering)
            if policy is None or policy.mode == "auto":
                self._choose(snapshot, model, policy, loads, now, chosen, starts, decisions)
        fleet_now = {**was.fleet_now, **self._publish_desired(snapshot, chosen.auto)}
        steps = self._steps_reached(snapshot, time.time(), chosen.moves)
        self.registry.choices = Choices(chosen.auto, chosen.classes, chosen.moves, fleet_now)
        self._publish_prices(snapshot, now)
        for reason, made in (("start", starts), ("load", decisions)):
            for decision in made:
                _log(decision, reason)
        await self._audit_round(_Audit(starts, decisions, steps))
        if self.webhooks is not None:  # moves only: a replica's first choice is no move
            for decision in decisions:
                self.webhooks.emit(method_moved(decision, snapshot))
        return decisions

    def _choose(
        self,
        snapshot: Snapshot,
        model: str,
        policy: PolicyView | None,
        loads: Sequence[tuple[float, float]],
        now: float,
        chosen: _Chosen,
        starts: list[Decision],
        decisions: list[Decision],
    ) -> None:
        """Choose an auto model's method, and each of its classes' with an objective of its
        own, at `loads` ((load, weight) pairs): into `chosen`, and the moves made (and a
        first choice) into the lists."""
        quarantined = policy.quarantined if policy is not None else frozenset()  # lossless
        costs, itls, bands = self._prices(snapshot, model, _choosable(snapshot, model), loads, now)
        load = sum(c * w for c, w in loads) / sum(w for _, w in loads)  # what the audit says
        own = ClassView("cost", policy.itl_objective_ms if policy is not None else None)
        current = chosen.auto.get(model)
        scores = kept_within(candidates(own, costs, itls), current, own, costs, itls, bands)
        decision, at_once = None, False
        if current is None:  # this replica's first choice: routing serves it from now on
            default = snapshot.default_method(model)  # what routing served until now
            first = min(scores, key=scores.__getitem__) if scores else default
            if first is not None:
                chosen.auto[model] = first
                if scores:  # a priced choice holds for the dwell time; the default does not
                    self._switched_at[(model, None)] = now
                else:
                    self._unpriced.add(model)
                itl = {m: itls[m] for m in scores}
                starts.append(Decision(model, default, first, load, scores, itl))
        else:
            decision = self._decide(model, None, current, scores, load, now)
            # the first priced choice replaces the default at once: it was no choice to warm
            at_once = model in self._unpriced
            if scores:
                self._unpriced.discard(model)
        if decision is not None:
            chosen.auto[model] = decision.after
            # leaving a quarantined method is at once too: it changes answers
            self._start_move(decision, chosen.moves, at_once or current in quarantined)
            decision = replace(decision, itl_ms={m: itls[m] for m in decision.usd_per_mtok})
            # the first priced choice is the replica's first choice still (a start, no move)
            (starts if at_once else decisions).append(decision)
        for name, objective in (policy.classes if policy is not None else {}).items():
            current = chosen.classes.get((model, name))  # None: first choice
            own_costs, own_itls = _class_prices(snapshot, model, name, costs, itls)
            scores = kept_within(
                candidates(objective, own_costs, own_itls), current, objective, own_costs,
                own_itls, bands,
            )  # fmt: skip
            decision = self._decide(model, name, current, scores, load, now)
            if decision is not None:  # a class's own choice moves at once
                chosen.classes[(model, name)] = decision.after
                priced = {m: own_costs[m] for m in scores}  # the candidates, both ways
                decision = replace(
                    decision, usd_per_mtok=priced, itl_ms={m: own_itls[m] for m in scores}
                )
                decisions.append(replace(decision, objective=objective.objective))

    async def _audit_round(self, audit: _Audit) -> None:
        """Write this round's entries, with any a database error kept back, or keep them."""
        if not (audit.starts or audit.decisions or audit.steps or self._unaudited):
            return
        audits = [*self._unaudited, audit]
        try:
            await asyncio.to_thread(self._audit, audits)
            self._unaudited = []
        except SQLAlchemyError as exc:  # kept for the next round, so none is lost
            self._unaudited = audits[-MAX_UNAUDITED_ROUNDS:]
            logger.warning("automatic switches not audited yet (retried): %s", exc)

    def _decide(
        self,
        model: str,
        request_class: str | None,
        current: str | None,
        scores: Mapping[str, float],
        load: float,
        now: float,
    ) -> Decision | None:
        """`decide` for one (model, class), with its own dwell time."""
        since = now - self._switched_at.get((model, request_class), 0.0)
        decision = decide(
            model,
            current,
            scores,
            load,
            since_switch_s=since,
            min_dwell_s=self.min_dwell_s,
            switch_margin=self.switch_margin,
        )
        if decision is not None:
            self._switched_at[(model, request_class)] = now
            decision = replace(decision, request_class=request_class)
        return decision

    def _start_move(self, decision: Decision, moves: dict[str, Move], at_once: bool) -> None:
        """Move an auto model's traffic to its new method in steps (or `at_once`, or with a
        step of everything)."""
        share, step_s = self.move_steps
        if at_once or decision.before is None or share >= 1:
            moves.pop(decision.model, None)
            return
        moves[decision.model] = Move(decision.before, decision.after, time.time(), share, step_s)

    def _steps_reached(
        self, snapshot: Snapshot, wall: float, moves: dict[str, Move]
    ) -> list[tuple[str, Move, int]]:
        """Steps of moves under way reached since the last round: (model, move, step). A move
        first seen already over (a restart, an old row) is not audited again; an auto move
        over leaves `moves`."""
        reached = []
        for model, policy in snapshot.policies.items():
            move = policy.move if policy.mode == "pinned" else moves.get(model)
            if move is None:
                self._steps_seen.pop(model, None)
                continue
            step = move.steps_taken(wall)
            seen = self._steps_seen.get(model)
            if seen is None and move.done(wall) and wall > move.started + move.duration_s + 60:
                self._steps_seen[model] = (move, step)
            elif seen is None or seen[0] != move or seen[1] < step:
                self._steps_seen[model] = (move, step)
                reached.append((model, move, step))
            if move.done(wall) and moves.get(model) == move:
                del moves[model]  # over: the auto choice serves alone
        return reached

    def _window(
        self, model: str, sample: float, average: float, now: float
    ) -> list[tuple[float, float]]:
        """The loads to price at, each with its weight: the moving average alone, or with a
        load window every sample in it, weighted by its load (at least 1: a request runs
        with itself)."""
        if self.load_window_s <= 0:
            return [(average, 1.0)]
        samples = self._samples.setdefault(model, deque())
        samples.append((now, sample))
        while samples[0][0] < now - self.load_window_s:
            samples.popleft()
        return [(c, max(c, 1.0)) for _, c in samples]

    @staticmethod
    def _smooth(averages: dict[str, float], model: str, sample: float) -> float:
        """The exponential moving average of `sample`, starting at the first one."""
        previous = averages.get(model, sample)
        averages[model] = (1 - EMA_WEIGHT) * previous + EMA_WEIGHT * sample
        return averages[model]

    @staticmethod
    def _delivering(
        snapshot: Snapshot,
        model: str,
        backends: Sequence[BackendView],
        in_flight: Mapping[str, float],
    ) -> float:
        """Output tokens/s the model's backends make at their in-flight counts (the curves)."""
        total = 0.0
        for b in backends:
            c = in_flight.get(b.name, 0)
            curve = snapshot.curves.get((model, b.method, b.gpu_type))
            if c > 0 and curve is not None:
                total += curve.at(c) * b.gpu_count
        return total

    def _publish_desired(self, snapshot: Snapshot, auto: Mapping[str, str]) -> dict[str, FleetNow]:
        """Size every model's pools for its smoothed throughput: set the gauge, and return
        the view per model."""
        self.desired_replicas.clear()  # no await before every label is set again
        fleet_now = {}
        for model in snapshot.backends:
            policy = snapshot.policies.get(model)
            objective = policy.itl_objective_ms if policy is not None else None
            routed = (
                policy.method
                if policy is not None and policy.mode == "pinned"
                else auto.get(model) or snapshot.default_method(model)
            )
            demand = self._throughput.get(model, 0.0)
            served = {b.method for b in snapshot.backends[model]}
            desired = {}
            for pool in pools(snapshot, model):
                if pool.method not in served:
                    continue  # plain as a baseline only: no pool to scale
                if pool.method == routed:
                    capacity = replica_capacity(pool.curve, pool.gpu_count, objective)
                    n = replicas_needed(
                        demand, capacity, self.sizing.headroom, self.sizing.min_replicas
                    )
                else:
                    n = self.sizing.idle_pool_replicas
                desired[pool.method] = n
                self.desired_replicas.labels(model=model, method=pool.method).set(n)
            fleet_now[model] = FleetNow(
                concurrency=self._load.get(model, 0.0),
                output_tokens_per_s=demand,
                routed_method=routed,
                desired_replicas=desired,
            )
        return fleet_now

    def _publish_prices(self, snapshot: Snapshot, now: float) -> None:
        """Set every model's price per method, and plain's beside each, at its load."""
        if self.prices is None:
            return
        method: dict[tuple[str, ...], float] = {}
        plain: dict[tuple[str, ...], float] = {}
        for model, backends in snapshot.backends.items():
            load = self._load.get(model, 0.0)
            priced = self._against_plain(snapshot, model, backends, load, now)
            for name, (usd, plain_usd) in priced.items():
                method[(model, name)], plain[(model, name)] = usd, plain_usd
        set_exactly(self.prices.method, method)
        set_exactly(self.prices.plain, plain)

    def _against_plain(
        self,
        snapshot: Snapshot,
        model: str,
        backends: Sequence[BackendView],
        load: float,
        now: float,
    ) -> dict[str, tuple[float, float]]:
        """($/1M, plain's $/1M on the same backend at the same load) per method with a
        healthy backend, its cheapest backend's, at the load `_prices` gives it."""
        healthy = [b for b in backends if self.registry.states[b.name].available(now)]
        replicas = Counter(b.method for b in healthy)
        best: dict[str, tuple[float, float]] = {}
        for b in healthy:
            c = max(load / replicas[b.method], 1.0)
            usd = snapshot.usd_per_mtok(model, b.method, b, c)
            plain = snapshot.usd_per_mtok(model, "plain", b, c)
            known = best.get(b.method)
            if usd is not None and plain is not None and (known is None or usd < known[0]):
                best[b.method] = (usd, plain)
        return best

    def _prices(
        self,
        snapshot: Snapshot,
        model: str,
        backends: Sequence[BackendView],
        loads: Sequence[tuple[float, float]],
        now: float,
    ) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
        """$/1M output tokens, ITL ms and the relative 95% half-width of both per method with
        a healthy backend, at these loads split over the method's replicas, averaged by their
        weights (gateway/policy/classes.py chooses among them)."""
        healthy = [b for b in backends if self.registry.states[b.name].available(now)]
        replicas = Counter(b.method for b in healthy)  # a method's load is split over these
        costs: dict[str, float] = {}
        itls: dict[str, float] = {}
        bands: dict[str, float] = {}
        total = sum(w for _, w in loads)
        for b in healthy:
            cost = itl = band = 0.0
            for load, weight in loads:
                c = max(load / replicas[b.method], 1.0)
                usd, ms = (
                    snapshot.usd_per_mtok(model, b.method, b, c),
                    snapshot.itl_ms(model, b.method, b, c),
                )
                if usd is None or ms is None:
                    break
                half = snapshot.relative_95(model, b.method, b.gpu_type, c) or 0.0
                cost, itl = cost + usd * weight / total, itl + ms * weight / total
                band += half * weight / total
            else:
                if b.method not in itls or itl < itls[b.method]:
                    bands[b.method] = band
                costs[b.method] = min(cost, costs.get(b.method, cost))
                itls[b.method] = min(itl, itls.get(b.method, itl))
        return costs, itls, bands

    def _audit(self, audits: list[_Audit]) -> None:
        with transaction(self.sessions) as session:
            for audit in audits:
                for reason, decisions in (("start", audit.starts), ("load", audit.decisions)):
                    for d in decisions:
                        record_method_switch(
                            session,
                            d.model,
                            d.before,
                            d.after,
                            d.concurrency,
                            d.usd_per_mtok,
                            ACTOR,
                            itl_ms=d.itl_ms,
                            request_class=d.request_class,
                            objective=d.objective,
                            reason=reason,
                        )
                for model, move, step in audit.steps:
                    share = min(1.0, step * move.step_share)
                    record_move_step(session, model, move.source, move.target, step, share, ACTOR)


def kept_within(
    scores: dict[str, float],
    current: str | None,
    objective: ClassView,
    costs: Mapping[str, float],
    itls: Mapping[str, float],
    bands: Mapping[str, float],
) -> dict[str, float]:
    """`scores`, with the current method kept among them while its ITL may still be within
    the objective: it is left for missing the objective only once its curve's 95% band is
    wholly above it (a method enters on its estimate). At low load a curve rests on few
    windows, and an estimate flickering across the objective moved traffic back and forth
    within seconds, past the dwell time (a method out of the objective is left at once).
    When no method is within it (the fastest stands in), the current one is kept beside the
    fastest while their bands overlap, so cost and the dwell time decide between them: in a
    burst that put every method over the objective, two about as fast by their window's
    estimates traded places twice in 1.5 s."""
    ceiling = objective.itl_objective_ms
    if (
        objective.objective != "cost"
        or ceiling is None
        or current is None
        or current in scores
        or current not in itls
    ):
        return scores
    low = itls[current] / (1 + bands.get(current, 0.0))  # its ITL at best, within its band
    if low > ceiling:  # surely over the objective: kept only beside a fastest it may match
        fastest = next(iter(scores), None)
        if any(itls[m] <= ceiling for m in scores) or fastest is None:
            return scores
        if low > itls[fastest] * (1 + bands.get(fastest, 0.0)):
            return scores  # surely slower than the fastest
        return {**scores, current: costs[current]}
    within = {m: s for m, s in scores.items() if itls[m] <= ceiling}  # not the fastest's stand-in
    return {**within, current: costs[current]}


def _choosable(snapshot: Snapshot, model: str) -> list[BackendView]:
    """The model's backends whose method the lossless watchdog has not quarantined."""
    policy = snapshot.policies.get(model)
    quarantined = policy.quarantined if policy is not None else frozenset()
    return [b for b in snapshot.backends[model] if b.method not in quarantined]


def _log(d: Decision, reason: str) -> None:
    """The log's line for a first choice or a move, with the prices behind it."""
    prices = ", ".join(
        f"{m} {usd:.3f}" + (f" ({d.itl_ms[m]:.2f} ms)" if m in d.itl_ms else "")
        for m, usd in sorted(d.usd_per_mtok.items())
    )
    what = "first choice" if reason == "start" else "moved"
    scope = d.model if d.request_class is None else f"{d.model} class {d.request_class}"
    logger.info("auto: %s %s %s -> %s at %.1f streams ($/1M output, ITL: %s)",
                scope, what, d.before, d.after, d.concurrency, prices)  # fmt: skip


def _class_prices(
    snapshot: Snapshot,
    model: str,
    request_class: str,
    costs: Mapping[str, float],
    itls: Mapping[str, float],
) -> tuple[dict[str, float], dict[str, float]]:
    """Each method's $/1M and ITL for one class: at the class's own acceptance where it has
    enough reports (gateway/acceptance.py: a verify step costs the same, so both scale by
    the method's acceptance over the class's), else the method's."""
    factors = {m: snapshot.class_prices.get((model, m, request_class)) for m in costs}
    own_costs = {m: c * (f.factor if (f := factors[m]) else 1.0) for m, c in costs.items()}
    own_itls = {m: t * (f.factor if (f := factors.get(m)) else 1.0) for m, t in itls.items()}
    return own_costs, own_itls
