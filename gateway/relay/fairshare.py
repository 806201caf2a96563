"""Fair share under saturation: when a model's backends are full, its requests wait in a
bounded queue of the model's own and are let in by weighted fair share across teams.

A model is full when the requests on its backends (this process's let in, plus what the
scrapes show other replicas and clients have there) reach its capacity: the most streams its
backends serve within the model's ITL objective, by the curves; or when every one of them
reported requests waiting in its engine's own queue at its last scrape. Not full, a request
passes at once: one comparison, and the hot path is otherwise unchanged.

Full, the request waits. A request's backend being done lets the next one in: of the highest
priority waiting (the lowest number, as vLLM orders it), the team that has been served the
fewest tokens for its weight. That is the Virtual Token Counter (Sheng et al., "Fairness in
Serving Large Language Models", OSDI 2024): each team's counter grows by the tokens of each
request let in (its prompt, and its completion as estimated, corrected to the served count
when it ends) over the team's weight; a team that starts waiting is lifted to the counter of
the team last let in, so a team that was idle banks no credit. A team that sends long prompts
pays for them and does not starve one that sends short ones. A key without a team is a team
of its own, and so are keyless requests together. Counters last while there is contention:
once no request has waited for `CALM_S`, the next starts afresh.

A request that waits past the queue timeout, or finds the queue at its bound, is answered 429
with `Retry-After`; its client leaving while it waits takes it out of the queue.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from gateway.errors import RateLimited
from gateway.metrics import GatewayMetrics
from gateway.registry import BackendState, Snapshot

CAPACITY_TTL_S = 0.5  # capacity is worked out again at most this often per model
POLL_S = 0.25  # a waiting request looks again this often (room may come from elsewhere)
CALM_S = 5.0  # no request waited this long: the spell of contention is over
FIRST_COMPLETION_GUESS = 256  # tokens a team's request is charged before it has finished one
COMPLETION_SMOOTHING = 0.2  # weight of each finished request in a team's completion mean


class Watch(Protocol):
    """Watching for the client leaving while its request waits (relay/departure.py)."""

    def arm(self) -> None: ...

    def disarm(self) -> None: ...


class QueueTimeout(RateLimited):
    """The model's backends stayed full for as long as the request could wait."""

    code = "queue_timeout"


class QueueFull(RateLimited):
    """The model's queue holds as many requests as it may."""

    code = "queue_full"


@dataclass(eq=False, slots=True)
class Share:
    """One team's place in one model's queue."""

    weight: float = 1.0
    counter: float = 0.0  # tokens served while contended, over the weight
    completion: float = float(FIRST_COMPLETION_GUESS)  # its requests' mean completion
    waiting: deque[Waiter] = field(default_factory=deque)


@dataclass(eq=False, slots=True)
class Waiter:
    """A request waiting for room."""

    share: Share
    priority: int
    tokens: float  # charged when it is let in
    since: float
    let_in: asyncio.Future[None]


@dataclass(eq=False, slots=True)
class Ticket:
    """A request let into its model's backends: `done` once its backend is done with it."""

    gate: Gate
    share: Share | None  # its team's, where it was charged (None: no contention, no charge)
    charged: float = 0.0
    spell: int = 0  # the gate's spell of contention it was charged in
    open: bool = True

    def done(self) -> None:
        """Its backend is done: room for the next (once, whatever calls it)."""
        if self.open:
            self.open = False
            self.gate.inside -= 1
            if self.gate.queued:
                self.gate.let_in_next()

    def served(self, prompt: int, completion: int) -> None:
        """Correct its team's counter from the tokens charged to the tokens served."""
        share = self.share
        if share is None or self.spell != self.gate.spell:
            return
        share.completion += COMPLETION_SMOOTHING * (completion - share.completion)
        share.counter += (prompt + completion - self.charged) / share.weight


@dataclass(eq=False)
class Gate:
    """One model's queue and the requests it let in."""

    share: FairShare
    model: str
    inside: int = 0  # requests let in, not yet done with by their backend (this process)
    queued: int = 0
    floor: float = 0.0  # the counter of the team last let in while contended
    spell: int = 0  # counts the spells of contention: counters last one spell
    waited_at: float = -CALM_S  # when a request last had to wait (monotonic)
    teams: dict[int, Share] = field(default_factory=dict)
    capacity: float | None = None
    capacity_at: float = -CAPACITY_TTL_S
    capacity_of: Snapshot | None = None

    def let_in_next(self) -> None:
        """Let waiting requests in while there is room."""
        while self.queued and not self.share.full(self):
            waiter = self._next()
            share = waiter.share
            share.waiting.popleft()
            self.queued -= 1
            self.inside += 1
            self.floor = share.counter
            share.counter += waiter.tokens / share.weight
            waiter.let_in.set_result(None)

    def _next(self) -> Waiter:
        """The first waiter of the highest priority's team with the lowest counter."""
        best: Waiter | None = None
        best_place = (0, 0.0)
        for share in self.teams.values():
            if share.waiting:
                first = share.waiting[0]
                place = (first.priority, share.counter)
                if best is None or place < best_place:
                    best, best_place = first, place
        assert best is not None
        return best


class FairShare:
    """Every model's gate, in one process."""

    def __init__(
        self,
        states: Mapping[str, BackendState],
        metrics: GatewayMetrics,
        max_queue: int,
        timeout_s: float,
    ) -> None:
        self.states = states
        self.metrics = metrics
        self.max_queue = max_queue
        self.timeout_s = timeout_s
        self.gates: dict[str, Gate] = {}
        self.snapshot: Snapshot | None = None  # the latest a request brought

    async def enter(
        self,
        snapshot: Snapshot,
        model: str,
        team: int,
        priority: int,
        prompt: Callable[[], int],
        departure: Watch,
    ) -> Ticket:
        """Let the request in now, or once it is its turn (a 429 past the timeout). `team`:
        its team's limiter subject (-id), its key's id without one, 0 without a key."""
        gate = self.gates.get(model) or self.gates.setdefault(model, Gate(self, model))
        self.snapshot = snapshot
        if gate.queued or self.full(gate):
            return await self._wait(gate, snapshot, team, priority, prompt(), departure)
        gate.inside += 1
        if not gate.teams:
            return Ticket(gate, None)
        if time.monotonic() - gate.waited_at > CALM_S:  # the contention is over
            gate.teams.clear()
            return Ticket(gate, None)
        share = self._share(gate, snapshot, team)  # contended lately: charged as it goes in
        charged = prompt() + share.completion
        share.counter += charged / share.weight
        return Ticket(gate, share, charged, gate.spell)

    async def _wait(
        self,
        gate: Gate,
        snapshot: Snapshot,
        team: int,
        priority: int,
        prompt: int,
        departure: Watch,
    ) -> Ticket:
        if gate.queued >= self.max_queue:
            self.metrics.fair_queue_refusals.labels(gate.model, "queue_full").inc()
            raise QueueFull(
                f"The backends of `{gate.model}` are full and {gate.queued} requests wait "
                "for them already; retry shortly",
                retry_after_s=1,
            )
        if not gate.teams:
            gate.spell += 1
        share = self._share(gate, snapshot, team)
        if not share.waiting:
            share.counter = max(share.counter, gate.floor)  # idle time banks no credit
        gate.waited_at = since = time.monotonic()
        tokens = prompt + share.completion
        waiter = Waiter(share, priority, tokens, since, asyncio.get_running_loop().create_future())
        share.waiting.append(waiter)
        gate.queued += 1
        waiting = self.metrics.fair_queue_waiting.labels(gate.model)
        waiting.inc()
        departure.arm()
        try:
            await self._until_let_in(gate, waiter)
        finally:
            departure.disarm()
            waiting.dec()
            if not waiter.let_in.done():  # timed out, or its client left: out of the queue
                share.waiting.remove(waiter)
                gate.queued -= 1
                waiter.let_in.cancel()
        self.metrics.fair_queue_wait.labels(gate.model).observe(time.monotonic() - since)
        return Ticket(gate, share, tokens, gate.spell)

    async def _until_let_in(self, gate: Gate, waiter: Waiter) -> None:
        deadline = waiter.since + self.timeout_s
        while not waiter.let_in.done():
            left = deadline - time.monotonic()
            if left <= 0:
                self.metrics.fair_queue_refusals.labels(gate.model, "queue_timeout").inc()
                raise QueueTimeout(
                    f"The backends of `{gate.model}` stayed full for {self.timeout_s:g} s "
                    "while the request waited its turn; retry shortly",
                    retry_after_s=max(1, round(self.timeout_s / 4)),
                )
            await asyncio.wait((waiter.let_in,), timeout=min(POLL_S, left))
            gate.let_in_next()  # room may have come from elsewhere (a scrape, a replica)

    @staticmethod
    def _share(gate: Gate, snapshot: Snapshot, team: int) -> Share:
        share = gate.teams.get(team)
        if share is None:
            view = snapshot.team_shares.get(-team) if team < 0 else None
            share = gate.teams[team] = Share(weight=view.weight if view else 1.0)
        return share

    def full(self, gate: Gate) -> bool:
        """Whether the model's backends have no room for one more request now."""
        snapshot, now = self.snapshot, time.monotonic()
        if snapshot is None:
            return False
        if gate.capacity_of is not snapshot or now - gate.capacity_at > CAPACITY_TTL_S:
            gate.capacity = capacity(snapshot, gate.model, self.states, now)
            gate.capacity_at, gate.capacity_of = now, snapshot
        if gate.capacity is None:
            return False
        return gate.inside + self._others(snapshot, gate.model) >= gate.capacity

    def _others(self, snapshot: Snapshot, model: str) -> float:
        """Requests on the model's backends that this process did not send, as last scraped."""
        scraped = sent = 0.0
        for b in snapshot.backends.get(model, ()):
            state = self.states[b.name]
            scraped += state.scraped_running or 0.0
            sent += state.in_flight
        return max(scraped - sent, 0.0)


def capacity(
    snapshot: Snapshot, model: str, states: Mapping[str, BackendState], now: float
) -> float | None:
    """The most requests the model's available backends serve at once: each one's streams
    within the model's ITL objective by its curve, none where its engine reported requests
    waiting at its last scrape. None (no bound) when some backend has neither bound, or none
    is available (routing then says so)."""
    policy = snapshot.policies.get(model)
    objective = policy.itl_objective_ms if policy is not None else None
    total, available = 0.0, False
    for b in snapshot.backends.get(model, ()):
        state = states[b.name]
        if not state.available(now):
            continue
        available = True
        if state.waiting > 0:
            continue  # its engine queues already: no room until a scrape says otherwise
        room = snapshot.streams_within(model, b.method, b, objective) if objective else None
        if room is None:
            return None
        total += room
    return total if available else None
