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
is not stored again. Each backend's engine version is read from its `/version` at the first
scrape and after each restart; each window keeps the drafter and version it was served by,
and the leader stores a backend's version where it changed (audited).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time

import httpx
from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from backends.probe import probe_version
from backends.vllm_metrics import VllmSnapshot, difference, parse_metrics
from gateway.control.windows import Gate, Tally
from gateway.db.base import utcnow
from gateway.db.session import transaction
from gateway.db.tables import Measurement
from gateway.events.webhooks import WebhookSender, backend_mismatch
from gateway.metrics import GatewayMetrics
from gateway.registry import BackendView, InFlightClock, Registry
from gateway.services.backends import record_engine_versions

logger = logging.getLogger(__name__)
SCRAPE_TIMEOUT_S = 2.0
ACTOR = "collector"  # who the audit log says changed a backend's engine version
MEASUREMENTS_LOCK = 0x6D656173  # PostgreSQL advisory lock key of scrape measurement writes


def method_mismatch(backend: BackendView, snapshot: VllmSnapshot) -> str | None:
    """Why the backend's counters contradict its declared method, if they do."""
    if backend.method == "plain" and snapshot.drafts is not None:
        return "declared plain but exposes spec-decode counters"
    if backend.method != "plain" and snapshot.drafts is None:
        return f"declared {backend.method} but exposes no spec-decode counters"
    return None


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
        self._versions_stored: dict[str, str | None] = {}  # the engine versions written
        self._info: dict[str, tuple[str, ...]] = {}  # each backend's info series' labels

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
        self._publish_info(backends)
        if self.stores:
            await self._store_versions(backends)

    def _publish_info(self, backends: list[BackendView]) -> None:
        """`draftgate_backend_info`: one series per enabled backend, as it runs now."""
        now: dict[str, tuple[str, ...]] = {}
        for b in backends:
            version = self.registry.states[b.name].engine_version or ""
            now[b.name] = (b.name, b.pool, b.method, b.drafter or "", version)
        for name, labels in self._info.items():
            if now.get(name) != labels:
                self.metrics.backend_info.remove(*labels)
        for labels in now.values():
            self.metrics.backend_info.labels(*labels).set(1)
        self._info = now

    async def _store_versions(self, backends: list[BackendView]) -> None:
        """Write each backend's engine version where it changed (audited, by the leader)."""
        changed = {}
        for backend in backends:
            read = self.registry.states[backend.name].engine_version
            known = self._versions_stored.get(backend.name, backend.engine_version)
            if read is not None and (read or None) != known:  # "": it serves no version
                changed[backend.name] = read or None
        if not changed:
            return
        try:
            await asyncio.to_thread(self._write_versions, changed)
        except SQLAlchemyError as exc:
            logger.warning("could not store engine versions: %s", exc)
            return
        self._versions_stored.update(changed)
        for name, version in changed.items():
            logger.info("%s: engine version %s", name, version or "not served")

    def _write_versions(self, versions: dict[str, str | None]) -> None:
        with transaction(self.sessions) as session:
            record_engine_versions(session, versions, ACTOR)

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
        """The backend's counters; and its engine version, when not known since it started."""
        try:
            url, auth = f"{backend.url}/metrics", backend.auth()
            response = await self.client.get(url, timeout=SCRAPE_TIMEOUT_S, headers=auth)
            response.raise_for_status()
            snapshot = parse_metrics(response.text)
        except (httpx.HTTPError, ValueError) as exc:
            logger.debug("scrape of %s failed: %s", backend.name, exc)
            return None
        state = self.registry.states[backend.name]
        if state.engine_version is None:
            version = await probe_version(self.client, backend.url, SCRAPE_TIMEOUT_S, auth)
            state.engine_version = version
        return snapshot

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
        if observation is None:  # the backend restarted: perhaps as another version
            state.engine_version = None
            return
        if min(sent.in_flight_s, sent.busy_s, sent.ended) < 0:
            return  # a worker restarted: its counts were lost
        if observation.output_tokens > 0 or sent.busy_s > 0:
            self._tally(backend, state.engine_version or None).add(observation, sent, in_flight_now)

    def _tally(self, backend: BackendView, version: str | None) -> Tally:
        """The backend's window, a new one when its drafter or engine version changed (the
        old one is not stored: its points would be priced as the new drafter's or engine's)."""
        entry = self._tallies.get(backend.name)
        if entry is not None and (entry[1].drafter, entry[1].engine_version) != (
            backend.drafter,
            version,
        ):
            self.metrics.windows_rejected.labels(backend.name, backend.pool, "changed").inc()
            entry = None
        if entry is None:
            tally = Tally(drafter=backend.drafter, engine_version=version)
            entry = self._tallies[backend.name] = (backend, tally)
        return entry[1]

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
