"""The collector: scrape every enabled backend's `/metrics`, turn counter deltas into load and
performance, feed routing at once and the measurements table once per window.

Per interval and backend: output tokens/s from `generation_tokens`, mean acceptance length
`1 + Δaccepted / Δdrafts` and per-position acceptance `Δaccepted_at_pos / Δdrafts` (vLLM's
own definitions), running/waiting/KV usage. A counter that went down means the backend
restarted: that interval is skipped, never turned into a negative or huge rate. Intervals
are summed per backend and written as one `scrape` measurement per window: the tokens
generated in it over the time requests were in flight, at their time-average (the integral
of requests in flight, from the gateway's in-flight clock of each backend, summed over the
replica's workers; the backend's own gauges when it also served others). A window with fewer
finished requests or output tokens than the gate asks, or with nothing in flight, is not
stored, only counted: a few short test requests would otherwise move the curves that price
every request; nor is one whose rate is above what the hardware can deliver (the planner's
ceiling, times a margin). A backend whose declared method disagrees with its counters is
flagged. Several replicas scrape the same backends; a window another replica already stored
is not stored again.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
from dataclasses import dataclass, field

import httpx
from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from backends.vllm_metrics import Observation, VllmSnapshot, difference, parse_metrics
from gateway.db.base import utcnow
from gateway.db.session import transaction
from gateway.db.tables import Measurement
from gateway.events.webhooks import WebhookSender, backend_mismatch
from gateway.metrics import GatewayMetrics
from gateway.registry import BackendView, InFlightClock, Registry
from planner.ceiling import ceiling_exceeded

logger = logging.getLogger(__name__)
SCRAPE_TIMEOUT_S = 2.0
# The backend finished more requests than this replica sent it (beyond what a scrape
# boundary shifts between windows): it has other clients.
FOREIGN_RATIO = 1.1
FOREIGN_SLACK = 2
MEASUREMENTS_LOCK = 0x6D656173  # PostgreSQL advisory lock key of scrape measurement writes


def method_mismatch(backend: BackendView, snapshot: VllmSnapshot) -> str | None:
    """Why the backend's counters contradict its declared method, if they do."""
    if backend.method == "plain" and snapshot.drafts is not None:
        return "declared plain but exposes spec-decode counters"
    if backend.method != "plain" and snapshot.drafts is None:
        return f"declared {backend.method} but exposes no spec-decode counters"
    return None


@dataclass(frozen=True)
class Gate:
    """The least a collector window must hold to become a measurement."""

    min_requests: int
    min_output_tokens: int
    # A window above the hardware's ceiling times this is not stored (None: never checked).
    ceiling_margin: float | None = None

    def above_ceiling(self, m: Measurement) -> bool:
        """Whether `m` is faster than its hardware can be, margin included."""
        return above_ceiling(m, self.ceiling_margin)


def above_ceiling(m: Measurement, margin: float | None) -> bool:
    """Whether `m` is faster than its model can run on its GPUs, `margin` times over (never
    for a model or GPU the planner's catalog does not know, nor without a margin)."""
    if margin is None:
        return False
    acceptance = m.mean_acceptance_length or (1 + m.k if m.method != "plain" else 1.0)
    rate, c = m.output_tokens_per_s, m.concurrency
    args = (m.model, m.gpu_type, m.gpu_count, c, acceptance, rate, margin)
    return ceiling_exceeded(*args) is not None


@dataclass
class Tally:
    """Observations of one backend, summed over a window: the backend's counters, and what
    this replica's gateway sent it (its in-flight clock) over the same scrapes."""

    seconds: float = 0.0
    output_tokens: float = 0.0
    drafts: float = 0.0
    accepted: float = 0.0
    accepted_per_position: list[float] = field(default_factory=list)
    finished: float | None = 0.0  # requests the backend finished (None: it does not say)
    prompt_tokens: float = 0.0
    sent: InFlightClock = field(default_factory=InFlightClock)
    gauge_in_flight_s: float = 0.0  # Σ running + waiting at each scrape, times its interval
    gauge_busy_s: float = 0.0  # Σ intervals that ended with a request running or waiting
    own_sampled_s: float = 0.0  # Σ this replica's requests on it at each scrape, times alike

    def add(self, o: Observation, sent: InFlightClock, in_flight_now: float = 0.0) -> None:
        """Add one scrape interval: the backend's counters, what this replica sent it over
        the interval, and what it had in flight on it at the scrape."""
        self.seconds += o.seconds
        self.output_tokens += o.output_tokens
        self.prompt_tokens += o.prompt_tokens
        self.finished = (
            None if o.finished is None or self.finished is None else (self.finished + o.finished)
        )
        self.drafts += o.drafts
        self.accepted += o.accepted
        self.sent = InFlightClock(
            self.sent.in_flight_s + sent.in_flight_s,
            self.sent.busy_s + sent.busy_s,
            self.sent.ended + sent.ended,
        )
        self.gauge_in_flight_s += o.running * o.seconds
        self.gauge_busy_s += o.seconds if o.running > 0 else 0.0
        self.own_sampled_s += in_flight_now * o.seconds
        grow = len(o.accepted_per_position) - len(self.accepted_per_position)
        self.accepted_per_position += [0.0] * max(0, grow)
        for i, value in enumerate(o.accepted_per_position):
            self.accepted_per_position[i] += value

    def foreign(self) -> bool:
        """Whether the backend finished requests this replica did not send it (other
        replicas' or other clients'): then the gateway's clock misses some of its load."""
        if self.finished is None:
            return True
        return self.finished > FOREIGN_RATIO * self.sent.ended + FOREIGN_SLACK

    def in_flight(self) -> tuple[float, float]:
        """The window's request-seconds in flight and busy seconds at the backend.

        The gateway's clock is exact for what it sent. When the backend also served others,
        their share is estimated from the backend's gauges (an instant per scrape): the
        gauges less this replica's own requests at the same instants, so that only the
        others' part is sampled; its busy time is the larger of the two. Another's traffic
        can only raise the concurrency a rate is stored at, never lower it.
        """
        in_flight_s, busy_s = self.sent.in_flight_s, self.sent.busy_s
        if self.foreign():
            in_flight_s += max(0.0, self.gauge_in_flight_s - self.own_sampled_s)
            busy_s = max(busy_s, self.gauge_busy_s)
        busy_s = min(busy_s, self.seconds)
        return max(in_flight_s, busy_s), busy_s

    def rejection(self, gate: Gate) -> str | None:
        """Why the window is too thin to be a measurement, if it is."""
        if self.finished is not None and self.finished < gate.min_requests:
            return "too_few_requests"
        if self.output_tokens < gate.min_output_tokens:
            return "too_few_tokens"
        if self.in_flight()[1] <= 0:
            return "nothing_in_flight"
        return None

    def measurement(self, backend: BackendView) -> Measurement:
        """The window as one `scrape` measurement: the output tokens generated in it over the
        time the backend had requests in flight, at their time-average over that time.

        A request that spans windows counts in each the tokens and the time it spent there.
        When the backend was busy all the window this is its tokens over the window at its
        mean requests in flight; when it sat idle part of it, the rate while it was busy
        (an idle backend generates nothing) at the requests in flight while busy (at least
        one). Only time measured in flight divides the tokens, never a figure derived from
        the requests that finished.
        """
        spec = self.drafts > 0
        in_flight_s, busy_s = self.in_flight()
        return Measurement(
            model=backend.model,
            method=backend.method,
            k=backend.k or 0,
            gpu_type=backend.gpu_type,
            gpu_count=backend.gpu_count,
            concurrency=in_flight_s / busy_s,
            output_tokens_per_s=self.output_tokens / busy_s,
            mean_acceptance_length=1 + self.accepted / self.drafts if spec else None,
            acceptance_per_position=[a / self.drafts for a in self.accepted_per_position]
            if spec
            else None,
            source="scrape",
            backend_name=backend.name,
            requests=None if self.finished is None else round(self.finished),
            mean_prompt_tokens=self.prompt_tokens / self.finished if self.finished else None,
            mean_output_tokens=self.output_tokens / self.finished if self.finished else None,
        )


class Collector:
    """Scrapes backends on an interval; writes a measurement per bucket per window."""

    def __init__(
        self,
        registry: Registry,
        client: httpx.AsyncClient,
        sessions: sessionmaker[Session],
        metrics: GatewayMetrics,
        *,
        interval_s: float,
        window_s: float,
        gate: Gate,
        webhooks: WebhookSender | None = None,  # told of each mismatch found
        stores: bool = True,
    ) -> None:
        self.webhooks = webhooks
        # Whether this process writes the measurements (with worker processes, the leader
        # alone does: every worker scrapes, for its routing's view of the load).
        self.stores = stores
        self.registry, self.client, self.sessions, self.metrics = (
            registry,
            client,
            sessions,
            metrics,
        )
        self.interval_s, self.window_s, self.gate = interval_s, window_s, gate
        self._last: dict[str, tuple[float, VllmSnapshot, InFlightClock]] = {}
        self._published: dict[str, InFlightClock] = {}  # this process's clocks, as counted
        self._tallies: dict[str, tuple[BackendView, Tally]] = {}
        self._window_start = time.monotonic()
        self._own_rows: dict[str, int] = {}  # the last measurement this collector stored

    async def run(self, stop: asyncio.Event) -> None:
        """Collect until `stop`, then write what the current window holds."""
        while not stop.is_set():
            await self.collect_once()
            if time.monotonic() - self._window_start >= self.window_s:
                await self.flush()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval_s)
        await self.flush()

    async def collect_once(self) -> None:
        """Scrape every enabled backend once."""
        backends = [b for group in self.registry.snapshot.backends.values() for b in group]
        pages = await asyncio.gather(*(self._scrape(b) for b in backends), return_exceptions=True)
        now = time.monotonic()
        clocks = self._in_flight_clocks(backends, now)
        instants = self.metrics.in_flight_by_backend() or {
            b.name: float(self.registry.states[b.name].in_flight) for b in backends
        }
        for backend, snapshot in zip(backends, pages, strict=True):
            if isinstance(snapshot, BaseException):  # that backend's alone: the others go on
                logger.warning("scrape of %s failed: %r", backend.name, snapshot)
            elif snapshot is not None:
                clock = clocks.get(backend.name, InFlightClock())
                self._absorb(backend, snapshot, now, clock, instants.get(backend.name, 0.0))

    def _in_flight_clocks(
        self, backends: list[BackendView], now: float
    ) -> dict[str, InFlightClock]:
        """Count what this process sent each backend since the last scrape, and read back
        the replica's clocks (over its workers' counters when it has workers)."""
        own = {}
        for backend in backends:
            clock = own[backend.name] = self.registry.states[backend.name].clock(now)
            change = clock.since(self._published.get(backend.name, InFlightClock()))
            self._published[backend.name] = clock
            self.metrics.publish_clock(backend.name, backend.pool, change)
        return self.metrics.in_flight_clocks() or own

    async def _scrape(self, backend: BackendView) -> VllmSnapshot | None:
        try:
            url, auth = f"{backend.url}/metrics", backend.auth()
            response = await self.client.get(url, timeout=SCRAPE_TIMEOUT_S, headers=auth)
            response.raise_for_status()
            return parse_metrics(response.text)
        except (httpx.HTTPError, ValueError) as exc:
            logger.debug("scrape of %s failed: %s", backend.name, exc)
            return None

    def _absorb(
        self,
        backend: BackendView,
        snapshot: VllmSnapshot,
        now: float,
        clock: InFlightClock,
        in_flight_now: float = 0.0,
    ) -> None:
        state = self.registry.states[backend.name]
        state.waiting, state.kv_usage = snapshot.waiting, snapshot.kv_cache_usage or 0.0
        mismatch = method_mismatch(backend, snapshot)
        if self.webhooks is not None and mismatch is not None and mismatch != state.mismatch:
            self.webhooks.emit(backend_mismatch(backend, mismatch))
        state.mismatch = mismatch
        self.metrics.mismatch.labels(backend.name, backend.pool).set(
            int(state.mismatch is not None)
        )
        previous = self._last.get(backend.name)
        self._last[backend.name] = (now, snapshot, clock)
        if previous is None:
            return
        observation = difference(previous[1], snapshot, now - previous[0])
        sent = clock.since(previous[2])
        if snapshot.drafts is None:
            state.acceptance_length = state.acceptance_per_position = None
        elif observation is not None and observation.drafts > 0:
            state.acceptance_length = 1 + observation.accepted / observation.drafts
            state.acceptance_per_position = tuple(
                a / observation.drafts for a in observation.accepted_per_position
            )
        if state.acceptance_length is None:
            self.metrics.acceptance_length.remove(backend.name, backend.pool)
        else:
            self.metrics.acceptance_length.labels(backend.name, backend.pool).set(
                state.acceptance_length
            )
        if observation is not None:  # the load, from every replica, that prices its requests
            state.scraped(observation.running)
        if observation is None or min(sent.in_flight_s, sent.busy_s, sent.ended) < 0:
            return  # a restart (of the backend, or of a worker whose counts were lost)
        if observation.output_tokens > 0 or sent.busy_s > 0:
            tally = self._tallies.setdefault(backend.name, (backend, Tally()))[1]
            tally.add(observation, sent, in_flight_now)

    async def flush(self) -> None:
        """Write one measurement per backend of the window; start a new window."""
        if not self.stores:  # another worker of this replica writes them
            self._tallies, self._window_start = {}, time.monotonic()
            return
        rows = []
        for backend, tally in self._tallies.values():
            reason = tally.rejection(self.gate)
            m = None if reason else tally.measurement(backend)
            if m is not None and self.gate.above_ceiling(m):
                reason = "above_ceiling"
                logger.warning(
                    "%s: a window of %.0f output tokens/s at concurrency %.2f is above what "
                    "its hardware can deliver; not stored",
                    backend.name,
                    m.output_tokens_per_s,
                    m.concurrency,
                )
            if reason:
                self.metrics.windows_rejected.labels(backend.name, backend.pool, reason).inc()
            elif m is not None:
                rows.append(m)
        self._tallies, self._window_start = {}, time.monotonic()
        if not rows:
            return
        try:
            stored = await asyncio.to_thread(
                store_unless_covered, self.sessions, rows, self._own_rows, self.window_s
            )
        except SQLAlchemyError as exc:
            logger.warning("could not store %d scrape measurements: %s", len(rows), exc)
            return
        self._own_rows.update(stored)


def store_unless_covered(
    sessions: sessionmaker[Session],
    rows: list[Measurement],
    own_rows: dict[str, int],
    recent_s: float,
) -> dict[str, int]:
    """Store the rows of backends no other replica stored a window for in the last
    `recent_s`; the stored rows' ids by backend.

    Every replica's collector scrapes the same backends, so without this each window would
    be stored once per replica. `own_rows` (the id of this collector's last row per backend)
    tells its own rows from the others'. On PostgreSQL the check and the insert hold a
    transaction lock, so two replicas flushing at the same moment cannot both insert.
    """
    names = [r.backend_name for r in rows]
    since = utcnow() - dt.timedelta(seconds=recent_s)
    with transaction(sessions) as session:
        if session.get_bind().dialect.name == "postgresql":
            session.execute(select(func.pg_advisory_xact_lock(MEASUREMENTS_LOCK)))
        recent = session.execute(
            select(Measurement.id, Measurement.backend_name).where(
                Measurement.source == "scrape",
                Measurement.backend_name.in_(names),
                Measurement.measured_at >= since,
            )
        )
        covered = {name for row_id, name in recent if name and own_rows.get(name) != row_id}
        fresh = [r for r in rows if r.backend_name not in covered]
        session.add_all(fresh)
        session.flush()
        return {r.backend_name: r.id for r in fresh if r.backend_name}
