"""Automatic method selection: for `auto` models, the method that is cheapest at the current load.

Every `selector_interval_s` the selector averages each auto model's in-flight requests (an
exponential moving average), prices every method with a healthy backend at that concurrency
from the measured throughput curves, and moves the model to the cheapest one — only when it
is cheaper by more than `switch_margin` (hysteresis) and the model has stayed on its method
for `min_dwell_s`. Each move is written to the audit log with the numbers behind it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from gateway.db.session import transaction
from gateway.registry import BackendView, Registry, Snapshot
from gateway.relay.routing import available
from gateway.services.models import record_method_switch

logger = logging.getLogger(__name__)
EMA_WEIGHT = 0.3  # weight of the newest sample in the load average
ACTOR = "auto"


@dataclass(frozen=True)
class Decision:
    """A move of one model to another method, and why."""

    model: str
    before: str | None
    after: str
    concurrency: float
    usd_per_mtok: Mapping[str, float]


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
    ) -> None:
        self.registry, self.sessions = registry, sessions
        self.interval_s, self.min_dwell_s, self.switch_margin = (
            interval_s,
            min_dwell_s,
            switch_margin,
        )
        self._load: dict[str, float] = {}
        self._switched_at: dict[str, float] = {}

    async def run(self, stop: asyncio.Event) -> None:
        """Decide on an interval until `stop`."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval_s)
            if not stop.is_set():
                await self.step()

    async def step(self) -> list[Decision]:
        """One round over every auto model."""
        decisions = []
        snapshot, now = self.registry.snapshot, time.monotonic()
        for model, backends in snapshot.backends.items():
            policy = snapshot.policies.get(model)
            if policy is not None and policy.mode != "auto":
                continue
            in_flight = sum(self.registry.states[b.name].in_flight for b in backends)
            load = self._load.get(model, float(in_flight))
            load = self._load[model] = (1 - EMA_WEIGHT) * load + EMA_WEIGHT * in_flight
            objective = policy.itl_objective_ms if policy is not None else None
            costs = self._costs(snapshot, model, backends, load, objective, now)
            current = self.registry.auto_method(model, snapshot)
            decision = decide(
                model,
                current,
                costs,
                load,
                since_switch_s=now - self._switched_at.get(model, 0.0),
                min_dwell_s=self.min_dwell_s,
                switch_margin=self.switch_margin,
            )
            if decision is not None:
                self.registry.auto_choice[model] = decision.after
                self._switched_at[model] = now
                decisions.append(decision)
        if decisions:
            try:
                await asyncio.to_thread(self._audit, decisions)
            except SQLAlchemyError as exc:
                logger.warning("automatic switches not audited: %s", exc)
        return decisions

    def _costs(
        self,
        snapshot: Snapshot,
        model: str,
        backends: Sequence[BackendView],
        load: float,
        itl_objective_ms: float | None,
        now: float,
    ) -> dict[str, float]:
        """$/1M tokens per method with a healthy backend, among those within the objective.

        When no method meets the ITL objective at this load, the fastest one is the only
        candidate: it is the closest the fleet can get.
        """
        healthy = [b for b in backends if available(b, self.registry.states[b.name], now)]
        replicas = Counter(b.method for b in healthy)  # a method's load is split over these
        costs: dict[str, float] = {}
        itls: dict[str, float] = {}
        for b in healthy:
            c = max(load / replicas[b.method], 1.0)
            cost, itl = (
                snapshot.usd_per_mtok(model, b.method, b, c),
                snapshot.itl_ms(model, b.method, b, c),
            )
            if cost is not None and itl is not None:
                costs[b.method] = min(cost, costs.get(b.method, cost))
                itls[b.method] = min(itl, itls.get(b.method, itl))
        if itl_objective_ms is None or not costs:
            return costs
        within = {m: v for m, v in costs.items() if itls[m] <= itl_objective_ms}
        if within:
            return within
        fastest = min(itls, key=itls.__getitem__)
        return {fastest: costs[fastest]}

    def _audit(self, decisions: list[Decision]) -> None:
        with transaction(self.sessions) as session:
            for d in decisions:
                record_method_switch(
                    session, d.model, d.before, d.after, d.concurrency, d.usd_per_mtok, ACTOR
                )
