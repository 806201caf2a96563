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

A request that waits past the queue timeout (to within `POLL_S`), or finds the queue at its
bound, is answered 429 with `Retry-After`; its client leaving while it waits takes it out of
the queue.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from gateway.errors import RateLimited
from gateway.metrics import GatewayMetrics
from gateway.registry import BackendState, BackendView, Snapshot

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
    waiting: dict[int, deque[Waiter]] = field(default_factory=dict)  # by priority, in order
    version: int = 0  # its places in the gate's order older than this are stale


@dataclass(eq=False, slots=True)
class Waiter:
    """A request waiting for room."""

    share: Share
    priority: int
    tokens: float  # charged when it is let in
    since: float
    let_in: asyncio.Future[None]
    admitted: bool = False


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
        if share.waiting:
            self.gate.place(share)


@dataclass(eq=False)
class Gate:
    """One model's queue and the requests it let in."""

    fair: FairShare  # the process's queues, whose settings and checks it uses
    model: str
    inside: int = 0  # requests let in, not yet done with by their backend (this process)
    queued: int = 0
    floor: float = 0.0  # the counter of the team last let in while contended
    spell: int = 0  # counts the spells of contention: counters last one spell
    waited_at: float = -CALM_S  # when a request last had to wait (monotonic)
    teams: dict[int, Share] = field(default_factory=dict)
    # Who goes next: a heap of (priority, counter, push count, version, team) for each
    # priority a team has requests waiting at; a place whose version is not its team's is
    # stale and dropped when it comes up (a counter changed, or the waiters left)
    order: list[tuple[int, float, int, int, Share]] = field(default_factory=list)
    pushes: int = 0
    ticking: asyncio.TimerHandle | None = None  # the next look for room while requests wait
    arrivals: deque[Waiter] = field(default_factory=deque)  # in order, to time them out
    capacity: float | None = None
    capacity_at: float = -CAPACITY_TTL_S
    capacity_of: Snapshot | None = None
    serving: tuple[BackendView, ...] = ()  # the backends its capacity counts

    def __post_init__(self) -> None:
        metrics = self.fair.metrics  # its series, looked up once
        self.waiting = metrics.fair_queue_waiting.labels(self.model)
        self.waited = metrics.fair_queue_wait.labels(self.model)

    def let_in_next(self) -> None:
        """Let waiting requests in while there is room."""
        while self.queued and not self.fair.full(self):
            waiter = self._next()
            share = waiter.share
            self.leave(waiter)
            self.inside += 1
            self.floor = share.counter
            share.counter += waiter.tokens / share.weight
            if share.waiting:
                self.place(share)
            waiter.admitted = True
            waiter.let_in.set_result(None)

    def join(self, waiter: Waiter) -> None:
        """A request starts waiting, last of its team's at its priority."""
        line = waiter.share.waiting.setdefault(waiter.priority, deque())
        line.append(waiter)
        self.queued += 1
        self.arrivals.append(waiter)
        if len(line) == 1:
            self.place(waiter.share)
        if self.ticking is None:
            self.ticking = asyncio.get_running_loop().call_later(POLL_S, self._look)

    def _look(self) -> None:
        """Every `POLL_S` while requests wait: let them in if room came from elsewhere (a
        scrape, another replica), and answer those that waited past the timeout (all wait
        as long, so the oldest go first)."""
        self.ticking = None
        self.let_in_next()
        arrivals, expired = self.arrivals, time.monotonic() - self.fair.timeout_s
        while arrivals and (arrivals[0].let_in.done() or arrivals[0].since <= expired):
            waiter = arrivals.popleft()
            if not waiter.let_in.done():
                self.fair.time_out(self, waiter)
        if self.queued:
            self.ticking = asyncio.get_running_loop().call_later(POLL_S, self._look)
        else:
            arrivals.clear()

    def leave(self, waiter: Waiter) -> None:
        """A request stops waiting: let in, timed out, or its client gone."""
        waiting = waiter.share.waiting
        line = waiting[waiter.priority]
        line.remove(waiter)  # the first, unless it timed out or its client left
        if not line:
            del waiting[waiter.priority]
        self.queued -= 1

    def place(self, share: Share) -> None:
        """(Re)place a team in the order at each priority it has requests waiting at."""
        share.version += 1
        for priority in share.waiting:
            self.pushes += 1
            heapq.heappush(self.order, (priority, share.counter, self.pushes, share.version, share))

    def _next(self) -> Waiter:
        """The first waiter of the highest priority's team with the lowest counter."""
        while True:
            priority, _, _, version, share = self.order[0]
            line = share.waiting.get(priority)
            if version == share.version and line:
                return line[0]
            heapq.heappop(self.order)  # stale


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
            gate.order.clear()
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
        loop = asyncio.get_running_loop()
        waiter = Waiter(share, priority, tokens, since, loop.create_future())
        gate.join(waiter)
        gate.waiting.inc()
        departure.arm()
        try:
            await waiter.let_in
        finally:
            departure.disarm()
            gate.waiting.dec()
            if not waiter.admitted:  # timed out, or its client left: out of the queue
                gate.leave(waiter)
                waiter.let_in.cancel()
        gate.waited.observe(time.monotonic() - since)
        return Ticket(gate, share, tokens, gate.spell)

    def time_out(self, gate: Gate, waiter: Waiter) -> None:
        """A waiter's time is up: a 429 (it leaves the queue as it wakes)."""
        self.metrics.fair_queue_refusals.labels(gate.model, "queue_timeout").inc()
        waiter.let_in.set_exception(
            QueueTimeout(
                f"The backends of `{gate.model}` stayed full for {self.timeout_s:g} s "
                "while the request waited its turn; retry shortly",
                retry_after_s=max(1, round(self.timeout_s / 4)),
            )
        )

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
            gate.serving = serving(snapshot, gate.model)
        if gate.capacity is None:
            return False
        return gate.inside + self._others(gate.serving) >= gate.capacity

    def _others(self, backends: tuple[BackendView, ...]) -> int:
        """Requests on these backends that this process did not send, as last scraped (whole
        ones: the smoothed scrape's lag behind this process's count is no request)."""
        scraped = sent = 0.0
        for b in backends:
            state = self.states[b.name]
            scraped += state.scraped_running or 0.0
            sent += state.in_flight
        return int(max(scraped - sent, 0.0))


def serving(snapshot: Snapshot, model: str) -> tuple[BackendView, ...]:
    """The backends the model's requests may go to: a pinned method's alone (requests past
    their room spill to other methods only under `auto`)."""
    backends = snapshot.backends.get(model, ())
    policy = snapshot.policies.get(model)
    if policy is not None and policy.mode == "pinned" and policy.method is not None:
        return tuple(b for b in backends if b.method == policy.method) or backends
    return backends


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
    for b in serving(snapshot, model):
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
