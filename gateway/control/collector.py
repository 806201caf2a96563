"""The collector: scrape every enabled backend's `/metrics`, turn counter deltas into load and
performance, feed routing at once and the measurements table once per window.

Per interval and backend: output tokens/s from `generation_tokens`, mean acceptance length
`1 + Δaccepted / Δdrafts` and per-position acceptance `Δaccepted_at_pos / Δdrafts` (vLLM's
own definitions), running/waiting/KV usage. A counter that went down means the backend
restarted: that interval is skipped, never turned into a negative or huge rate. Intervals
are summed per backend and written as one `scrape` measurement per window, at the window's
mean concurrency (Little's law over the whole window: the latency of a request lands in the
interval it finished in, its tokens in every interval it ran, so only window totals pair
up; the planner's curves bin the stored concurrencies). A window with fewer finished
requests or output tokens than the gate asks is not stored, only counted: a few short test
requests would otherwise move the curves that price every request. A backend whose declared method
disagrees with its counters is flagged. Several replicas scrape the same backends; a window
another replica already stored is not stored again.
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
from gateway.metrics import GatewayMetrics
from gateway.registry import BackendView, Registry
from gateway.webhooks import WebhookSender, backend_mismatch

logger = logging.getLogger(__name__)
SCRAPE_TIMEOUT_S = 2.0
MIN_BUSY_FRACTION = 0.05  # below this a window says too little about the busy rate
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


@dataclass
class Tally:
    """Observations of one backend at one concurrency bucket, summed over a window."""

    seconds: float = 0.0
    output_tokens: float = 0.0
    drafts: float = 0.0
    accepted: float = 0.0
    accepted_per_position: list[float] = field(default_factory=list)
    running_seconds: float = 0.0
    latency_s: float = 0.0  # Σ latency of the requests that finished in the window
    finished: float | None = 0.0  # requests finished (None: the server does not say)
    prompt_tokens: float = 0.0

    def add(self, o: Observation) -> None:
        self.seconds += o.seconds
        self.output_tokens += o.output_tokens
        self.prompt_tokens += o.prompt_tokens
        self.finished = (
            None if o.finished is None or self.finished is None else (self.finished + o.finished)
        )
        self.drafts += o.drafts
        self.accepted += o.accepted
        self.running_seconds += o.running * o.seconds
        self.latency_s += o.latency_s
        grow = len(o.accepted_per_position) - len(self.accepted_per_position)
        self.accepted_per_position += [0.0] * max(0, grow)
        for i, value in enumerate(o.accepted_per_position):
            self.accepted_per_position[i] += value

    def rejection(self, gate: Gate) -> str | None:
        """Why the window is too thin to be a measurement, if it is."""
        if self.finished is not None and self.finished < gate.min_requests:
            return "too_few_requests"
        if self.output_tokens < gate.min_output_tokens:
            return "too_few_tokens"
        return None

    def measurement(self, backend: BackendView) -> Measurement | None:
        """The window as one `scrape` measurement (None when it says too little).

        The window's mean concurrency is, by Little's law, the latency of the requests that
        finished in it over its length (the scrape-time running gauge when none finished).
        Below one request on average the backend sat idle part of the time; its rate while
        busy is what a request sees, so the window is stored at concurrency 1 — unless no
        request finished in it, when its busy time is unknown.
        """
        spec = self.drafts > 0
        busy_s = self.latency_s or self.running_seconds
        concurrency = busy_s / self.seconds
        output_tokens_per_s = self.output_tokens / self.seconds
        if concurrency < 1:
            if not self.latency_s:
                return None
            output_tokens_per_s /= max(concurrency, MIN_BUSY_FRACTION)
            concurrency = 1.0
        return Measurement(
            model=backend.model,
            method=backend.method,
            k=backend.k or 0,
            gpu_type=backend.gpu_type,
            gpu_count=backend.gpu_count,
            concurrency=concurrency,
            output_tokens_per_s=output_tokens_per_s,
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
        self._last: dict[str, tuple[float, VllmSnapshot]] = {}
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
        for backend, snapshot in zip(backends, pages, strict=True):
            if isinstance(snapshot, BaseException):  # that backend's alone: the others go on
                logger.warning("scrape of %s failed: %r", backend.name, snapshot)
            elif snapshot is not None:
                self._absorb(backend, snapshot, now)

    async def _scrape(self, backend: BackendView) -> VllmSnapshot | None:
        try:
            url, auth = f"{backend.url}/metrics", backend.auth()
            response = await self.client.get(url, timeout=SCRAPE_TIMEOUT_S, headers=auth)
            response.raise_for_status()
            return parse_metrics(response.text)
        except (httpx.HTTPError, ValueError) as exc:
            logger.debug("scrape of %s failed: %s", backend.name, exc)
            return None

    def _absorb(self, backend: BackendView, snapshot: VllmSnapshot, now: float) -> None:
        state = self.registry.states[backend.name]
        state.waiting, state.kv_usage = snapshot.waiting, snapshot.kv_cache_usage or 0.0
        mismatch = method_mismatch(backend, snapshot)
        if self.webhooks is not None and mismatch is not None and mismatch != state.mismatch:
            self.webhooks.emit(backend_mismatch(backend, mismatch))
        state.mismatch = mismatch
        self.metrics.mismatch.labels(backend.name).set(int(state.mismatch is not None))
        previous = self._last.get(backend.name)
        self._last[backend.name] = (now, snapshot)
        if previous is None:
            return
        observation = difference(previous[1], snapshot, now - previous[0])
        if snapshot.drafts is None:
            state.acceptance_length = state.acceptance_per_position = None
        elif observation is not None and observation.drafts > 0:
            state.acceptance_length = 1 + observation.accepted / observation.drafts
            state.acceptance_per_position = tuple(
                a / observation.drafts for a in observation.accepted_per_position
            )
        if state.acceptance_length is None:
            self.metrics.acceptance_length.remove(backend.name)
        else:
            self.metrics.acceptance_length.labels(backend.name).set(state.acceptance_length)
        if observation is not None:  # the load, from every replica, that prices its requests
            state.scraped(observation.running)
        if observation is None or observation.output_tokens <= 0:
            return
        self._tallies.setdefault(backend.name, (backend, Tally()))[1].add(observation)

    async def flush(self) -> None:
        """Write one measurement per backend of the window; start a new window."""
        if not self.stores:  # another worker of this replica writes them
            self._tallies, self._window_start = {}, time.monotonic()
            return
        rows = []
        for backend, tally in self._tallies.values():
            if reason := tally.rejection(self.gate):
                self.metrics.windows_rejected.labels(backend.name, reason).inc()
            elif (m := tally.measurement(backend)) is not None:
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
