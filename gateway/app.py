"""The gateway application: `create_app(settings)` and its lifespan."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio.to_thread
import httpx
from fastapi import FastAPI
from httpx_aiohttp import AiohttpTransport
from sqlalchemy import Engine
from sqlalchemy.exc import DataError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from gateway import apidocs, health, openai_routes
from gateway.accounting import Ledger
from gateway.admin import admin_router
from gateway.control.benchmarks import BenchmarkManager
from gateway.control.collector import Collector
from gateway.control.leader import Leader
from gateway.control.managed import ManagedBackends
from gateway.control.prober import probe_forever
from gateway.control.windows import Gate
from gateway.db import migrate
from gateway.db.sealed import use_keys
from gateway.db.session import make_engine, make_sessionmaker, on_audit_commit, transaction
from gateway.db.tables import LosslessCheck
from gateway.deps import Components, authorize_admin
from gateway.error_handlers import (
    install_error_handlers,
    limited,
    on_database_unavailable,
    on_out_of_range,
)
from gateway.events.budget_alerts import BudgetWatch
from gateway.events.webhooks import WebhookSender
from gateway.homes import STORED_RESPONSES, ResponseHomes
from gateway.limits import Limiter, budgeted_spend
from gateway.metrics import GatewayMetrics, set_exactly
from gateway.registry import Registry
from gateway.relay.proxy import Relay
from gateway.relay.shadow import Check, Shadow
from gateway.relay.tokens import Tokens
from gateway.relay.upstream import UPSTREAM_KEEPALIVE_S, Upstream
from gateway.server.inflight import INFLIGHT_FILE, SharedInFlight
from gateway.server.replica import Changes, Replica
from gateway.server.shared_budget import BUDGETS_FILE, SharedBudgets
from gateway.services.fleet import apply_fleet, load_fleet
from gateway.services.sealing import seal_stored_keys, unsealed_keys
from gateway.settings import Settings

if TYPE_CHECKING:
    from gateway.events.tracing import Tracing

logger = logging.getLogger(__name__)
VERSION = "0.1.0"


def prepare_database(settings: Settings, engine: Engine) -> None:
    """Bring the schema to head (if configured) and apply the fleet file (if any)."""
    if settings.migrate_on_start:
        migrate.upgrade(engine)
    if settings.fleet is not None:
        fleet = load_fleet(settings.fleet)
        with transaction(make_sessionmaker(engine)) as session:
            apply_fleet(session, fleet, allow_link_local=settings.allow_link_local_backends)
        logger.info("applied fleet file %s", settings.fleet)
    with transaction(make_sessionmaker(engine)) as session:
        if sealed := seal_stored_keys(session):
            logger.info("sealed %d backend API keys under the first secrets key", sealed)
        if plain := unsealed_keys(session):
            logger.warning(
                "%d backend API keys are stored unsealed: set DRAFTGATE_SECRETS_KEY (or "
                "DRAFTGATE_SECRETS_KEY_FILE) to seal them (docs/deploy.md)",
                plain,
            )


CONTROL_CONNECTIONS = 8  # the prober's and collector's own pool: short, sequential calls


def upstream_client(
    settings: Settings, max_connections: int = CONTROL_CONNECTIONS
) -> httpx.AsyncClient:
    """A pooled httpx client for the control loops' calls to backends, a pool of their own
    (the relay's is gateway/relay/upstream.py), so client traffic can never take the
    connections health checks need."""
    connections = max_connections
    timeout = httpx.Timeout(
        connect=settings.connect_timeout_s,
        read=settings.read_timeout_s,
        write=settings.read_timeout_s,
        pool=settings.pool_timeout_s,
    )
    limits = httpx.Limits(
        max_connections=connections,
        max_keepalive_connections=connections,
        keepalive_expiry=UPSTREAM_KEEPALIVE_S,
    )
    # trust_env off: backends are reached directly, never through an environment's proxy.
    transport = AiohttpTransport(limits=limits, trust_env=False)
    return httpx.AsyncClient(transport=transport, timeout=timeout, trust_env=False)


class GatewayApp(FastAPI):
    """FastAPI for everything but `POST /v1/*`, which goes straight to the relay."""

    relay: Relay | None = None
    tracing: Tracing | None = None  # set while running with tracing on
    max_body_bytes: int | None = None  # the relay checks /v1 bodies; this bounds the others

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if (
            self.relay is not None
            and scope["type"] == "http"
            and scope["method"] == "POST"
            and scope["path"].startswith("/v1/")
            and not scope["path"].startswith(STORED_RESPONSES)  # /cancel: openai_routes.py
        ):
            await self.relay(scope, receive, send)
            return
        if scope["type"] == "http" and self.max_body_bytes is not None:
            receive = limited(receive, self.max_body_bytes)
        tracing = self.tracing
        if tracing is not None and scope["type"] == "http" and tracing.is_admin_change(scope):
            await tracing.serve_admin(scope, receive, send, super().__call__)
            return
        await super().__call__(scope, receive, send)


def create_app(
    settings: Settings, managed: ManagedBackends | None = None, replica: Replica | None = None
) -> GatewayApp:
    """Build the gateway: the relay, `/v1/models`, health, metrics and the admin API.

    `managed` holds the backend servers this process started (`draftgate up`) and how to
    start more; without it no backend can be switched here. `replica` places this process
    among its replica's worker processes (gateway/server/replica.py); without it, it is the
    only one.
    """
    if settings.admin_token is None:
        raise ValueError("settings.admin_token is required (DRAFTGATE_ADMIN_TOKEN)")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        assert isinstance(app, GatewayApp)
        use_keys(settings.secrets_keys())  # before any backend key is read or written
        engine = make_engine(settings.database_url)
        try:
            await anyio.to_thread.run_sync(prepare_database, settings, engine)
            managed_here = managed or ManagedBackends(None, Path())
            async with _running(settings, engine, app, managed_here, replica):
                yield
        finally:
            engine.dispose()

    app = GatewayApp(
        title="draftgate", version=VERSION, lifespan=lifespan, docs_url=None, redoc_url=None
    )
    app.max_body_bytes = settings.max_body_bytes
    install_error_handlers(app, authorize_admin)
    app.add_exception_handler(OperationalError, on_database_unavailable)
    app.add_exception_handler(DataError, on_out_of_range)  # PostgreSQL's, on a huge integer
    app.include_router(health.router)
    app.include_router(apidocs.router)  # /docs and /redoc, offline
    app.include_router(openai_routes.router)
    app.include_router(admin_router())
    return app


def _publish_snapshot_figures(
    metrics: GatewayMetrics, registry: Registry, limiter: Limiter, named: bool
) -> None:
    """The gauges a fresh snapshot changes: keys' budget use and the planner's error."""
    snapshot = registry.snapshot
    set_exactly(metrics.budget_used, limiter.budget_used(snapshot, named))
    set_exactly(metrics.team_budget_used, limiter.budget_used(snapshot, named, teams=True))
    set_exactly(metrics.planner_error, {(m,): e for m, e in snapshot.planner_error().items()})


def start_tracing(settings: Settings) -> Tracing | None:
    """The tracer when `settings.tracing` is on (the `otel` extra, imported only then)."""
    if not settings.tracing:
        return None
    try:
        from gateway.events import tracing
    except ImportError as exc:
        message = "DRAFTGATE_TRACING=true needs the otel extra: pip install 'draftgate[otel]'"
        raise RuntimeError(f"{message} ({exc})") from exc
    return tracing.start_tracing(settings, VERSION)


def _worker_metrics(replica: Replica | None) -> GatewayMetrics:
    """This worker's metrics, shared over the replica's workers when it has any."""
    metrics = GatewayMetrics(None if replica is None else replica.metrics_dir)
    if replica is not None:  # the leader's file until this worker leads
        metrics.leader_gauges_file = replica.gauges_file
    return metrics


def _limiter(
    settings: Settings, sessions: sessionmaker[Session], registry: Registry, replica: Replica | None
) -> Limiter:
    """The keys' limits; with a replica, a key's requests in flight and budget are counted
    over every worker."""
    shared = budgets = None
    if replica is not None:
        directory, slot, workers = replica.directory, replica.slot, settings.workers
        shared = SharedInFlight(directory / INFLIGHT_FILE, slot, workers)
        spend = budgeted_spend(registry.snapshot)  # the first read, made after any predecessor died
        budgets = SharedBudgets(directory / BUDGETS_FILE, slot, workers, spend)
    return Limiter(sessions, settings.limits_sync_s, shared, budgets)


def _follow_snapshots(
    settings: Settings,
    registry: Registry,
    metrics: GatewayMetrics,
    ledger: Ledger,
    limiter: Limiter,
    replica: Replica | None,
) -> WebhookSender | None:
    """Hook the registry's loads: the limiter, budget alerts and gauges follow each new
    snapshot. The webhook sender, None without webhook URLs (then nothing runs)."""
    registry.on_load_start.append(lambda: limiter.snapshot_starting(ledger.unwritten_usd_by_key()))
    registry.on_load.append(lambda: limiter.snapshot_loaded(registry.snapshot))
    webhooks = WebhookSender.of(settings, metrics)
    if webhooks is not None:
        webhooks.leading = replica is None  # events go out from the leader alone
        watch = BudgetWatch(settings.budget_thresholds, webhooks)
        registry.on_load_start.append(watch.load_starting)
        registry.on_load.append(lambda: watch.check(registry.snapshot))
    named = settings.metrics_name_keys
    registry.on_load.append(lambda: _publish_snapshot_figures(metrics, registry, limiter, named))
    return webhooks


@dataclass(frozen=True)
class _Loops:
    """A worker's background loops. Loops that touch the database stop at `stop` (never
    mid-query, so no connection is left behind); the prober only talks HTTP and is
    cancelled."""

    stop: asyncio.Event
    stoppable: list[asyncio.Task[None]]
    prober: asyncio.Task[None]

    async def halt(self, registry: Registry, ledger: Ledger) -> None:
        """Stop every loop and wait for them all."""
        self.stop.set()
        registry.wake()
        ledger.wake()
        self.prober.cancel()
        await asyncio.gather(self.prober, *self.stoppable, return_exceptions=True)


def _start_loops(
    components: Components,
    ledger: Ledger,
    limiter: Limiter,
    control: httpx.AsyncClient,
    webhooks: WebhookSender | None,
    replica: Replica | None,
) -> _Loops:
    """Start the registry's, ledger's and limiter's loops, the collector, the leader's
    work, the watch for other workers' changes and the prober. Every worker scrapes, for
    its routing's view of the load; the leader alone stores measurements."""
    settings, sessions = components.settings, components.sessions
    registry, metrics = components.registry, components.metrics
    stop = asyncio.Event()
    collector = Collector(
        registry,
        control,
        sessions,
        metrics,
        interval_s=settings.collect_interval_s,
        window_s=settings.measurement_window_s,
        gate=Gate(
            settings.measurement_min_requests,
            settings.measurement_min_output_tokens,
            settings.measurement_ceiling_margin,
        ),
        webhooks=webhooks,
        stores=replica is None,
    )
    benchmarks = BenchmarkManager(sessions, settings.measurement_ceiling_margin)
    leader = Leader(
        settings, sessions, registry, metrics, collector, benchmarks, webhooks, replica, control
    )
    stoppable = [
        asyncio.create_task(c)
        for c in (
            registry.run(stop),
            ledger.run(stop),
            limiter.run(stop),
            collector.run(stop),
            leader.run(stop),
        )
    ]
    if components.changes is not None:
        stoppable.append(asyncio.create_task(components.changes.watch(registry, stop)))
    prober = asyncio.create_task(
        probe_forever(registry, control, settings.probe_interval_s, metrics, webhooks)
    )
    return _Loops(stop, stoppable, prober)


def _shadow(
    settings: Settings, metrics: GatewayMetrics, registry: Registry, sessions: sessionmaker[Session]
) -> Shadow | None:
    """The lossless watchdog's sampler, storing each check (None: it samples nothing)."""

    def insert(check: Check) -> None:
        with transaction(sessions) as session:
            session.add(LosslessCheck(**asdict(check)))

    return Shadow.of(settings, metrics, registry.states, insert)


async def _close(
    client: Upstream,
    control: httpx.AsyncClient,
    webhooks: WebhookSender | None,
    tracing: Tracing | None,
) -> None:
    """Close the backends' connection pools, the webhook sender and the tracer, in turn."""
    await client.aclose()
    await control.aclose()
    if webhooks is not None:
        await webhooks.aclose()
    if tracing is not None:
        await anyio.to_thread.run_sync(tracing.shutdown)


@asynccontextmanager
async def _running(
    settings: Settings,
    engine: Engine,
    app: GatewayApp,
    managed: ManagedBackends,
    replica: Replica | None,
) -> AsyncIterator[None]:
    """Start the registry, ledger, limiter, prober and relay, and what the replica's leader
    runs once this worker leads; drain the ledger at the end."""
    sessions = make_sessionmaker(engine)
    metrics = _worker_metrics(replica)
    registry = Registry(
        sessions,
        settings.registry_refresh_s,
        settings.measurement_max_age_s,
        settings.class_acceptance_min_requests,
    )
    await anyio.to_thread.run_sync(registry.load)
    ledger = Ledger(
        sessions,
        metrics,
        batch_size=settings.ledger_batch_size,
        flush_interval_s=settings.ledger_flush_interval_s,
        max_pending=settings.ledger_max_pending,
        access_log_interval_s=settings.access_log_interval_s,
    )
    limiter = _limiter(settings, sessions, registry, replica)
    webhooks = _follow_snapshots(settings, registry, metrics, ledger, limiter, replica)
    client = Upstream(settings)
    control = upstream_client(settings, CONTROL_CONNECTIONS)
    changes = None if replica is None else Changes(replica, settings.workers)
    homes = ResponseHomes(sessions, settle_s=2 * settings.ledger_flush_interval_s)
    components = Components(
        settings, engine, sessions, registry, metrics, managed, changes, homes, control
    )
    app.state.components = components
    tracing = start_tracing(settings)
    if tracing is not None:
        on_audit_commit(sessions, tracing.audited)
    shadow = _shadow(settings, metrics, registry, sessions)
    tokens = Tokens.of(settings, control)  # None unless an OIDC issuer is configured
    app.relay = relay = Relay(
        settings, registry, ledger, limiter, metrics, client, homes, tracing, shadow, tokens
    )
    app.tracing = tracing
    loops = _start_loops(components, ledger, limiter, control, webhooks, replica)
    if shadow is not None:  # replays through this worker's relay, one at a time
        replays = shadow.run(relay, lambda: registry.snapshot, loops.stop)
        loops.stoppable.append(asyncio.create_task(replays))
    try:
        yield
    finally:
        app.relay = app.tracing = None
        await loops.halt(registry, ledger)
        await managed.close(sessions)
        await ledger.drain()
        await _close(client, control, webhooks, tracing)
