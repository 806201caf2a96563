"""Liveness and readiness: `GET /health` and `GET /ready`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError

from gateway.db.tables import Backend
from gateway.deps import ServicesDep
from gateway.errors import ServiceUnavailable

router = APIRouter(tags=["health"])


@router.get("/health")
async def health() -> dict[str, str]:
    """The process is alive."""
    return {"status": "ok"}


@router.get("/ready")
def ready(services: ServicesDep) -> dict[str, Any]:
    """The database answers and at least one backend passes its health checks.

    An open circuit breaker does not make a backend unhealthy here: it is the relay's short
    avoidance of a backend that failed requests, and routing still falls back to it when
    every breaker is open, so failing requests cannot pull every replica out of a Service
    at once. Readiness follows the prober, which asks each backend itself.
    """
    try:
        with services.sessions() as session:
            session.scalar(select(func.count()).select_from(Backend))
    except SQLAlchemyError as exc:
        raise ServiceUnavailable(f"database unreachable: {type(exc).__name__}") from exc
    registry = services.registry
    backends = [b for group in registry.snapshot.backends.values() for b in group]
    healthy = [b.name for b in backends if registry.states[b.name].healthy]
    if not healthy:
        raise ServiceUnavailable(f"no healthy backend ({len(backends)} enabled)")
    return {"status": "ready", "database": "ok", "backends_healthy": len(healthy)}
