"""Liveness, readiness and the backend prober."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
from fastapi import APIRouter
from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError

from backends.probe import Probe, probe_health
from gateway.db.tables import Backend
from gateway.deps import ServicesDep
from gateway.errors import ServiceUnavailable
from gateway.metrics import GatewayMetrics
from gateway.registry import BackendState, Registry

router = APIRouter(tags=["health"])
SLOW_PROBES_DOWN = 2  # a server too busy to answer /health once is not yet taken out


@router.get("/health")
async def health() -> dict[str, str]:
    """The process is alive."""
    return {"status": "ok"}


@router.get("/ready")
def ready(services: ServicesDep) -> dict[str, Any]:
    """The database answers and at least one backend is healthy."""
    try:
        with services.sessions() as session:
            session.scalar(select(func.count()).select_from(Backend))
    except SQLAlchemyError as exc:
        raise ServiceUnavailable(f"database unreachable: {type(exc).__name__}") from exc
    registry, now = services.registry, time.monotonic()
    backends = [b for group in registry.snapshot.backends.values() for b in group]
    healthy = [
        b.name
        for b in backends
        if registry.states[b.name].healthy and registry.states[b.name].open_until <= now
    ]
    if not healthy:
        raise ServiceUnavailable(f"no healthy backend ({len(backends)} enabled)")
    return {"status": "ready", "database": "ok", "backends_healthy": len(healthy)}


async def probe_forever(
    registry: Registry, client: httpx.AsyncClient, interval_s: float, metrics: GatewayMetrics
) -> None:
    """Probe every enabled backend's `/health` on an interval; publish health gauges."""
    while True:
        backends = [b for group in registry.snapshot.backends.values() for b in group]
        results = await asyncio.gather(
            *(probe_health(client, b.url, timeout_s=min(interval_s, 2.0)) for b in backends)
        )
        now = time.monotonic()
        for backend, result in zip(backends, results, strict=True):
            state = registry.states[backend.name]
            apply_probe(state, result)
            metrics.healthy.labels(backend.name).set(int(state.healthy and state.open_until <= now))
            metrics.in_flight.labels(backend.name).set(state.in_flight)
        await asyncio.sleep(interval_s)


def apply_probe(state: BackendState, result: Probe) -> None:
    """A refusal takes a backend out at once; silence only `SLOW_PROBES_DOWN` times running."""
    state.slow_probes = state.slow_probes + 1 if result is Probe.SLOW else 0
    if result is Probe.HEALTHY:
        state.healthy = True
    elif result is Probe.DOWN or state.slow_probes >= SLOW_PROBES_DOWN:
        state.healthy = False
