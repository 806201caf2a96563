"""Liveness and readiness: `GET /health` and `GET /ready`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from gateway.control.readiness import check_ready
from gateway.deps import ComponentsDep
from gateway.errors import ServiceUnavailable

router = APIRouter(tags=["health"])


@router.get("/health")
async def health() -> dict[str, str]:
    """The process is alive."""
    return {"status": "ok"}


@router.get("/ready")
def ready(components: ComponentsDep) -> dict[str, Any]:
    """The database answers and at least one backend passes its health checks
    (gateway/control/readiness.py says why an open circuit breaker does not count)."""
    readiness = check_ready(components.sessions, components.registry)
    if readiness.problem is not None:
        raise ServiceUnavailable(readiness.problem)
    answer: dict[str, Any] = {
        "status": "ready",
        "database": "ok",
        "backends_healthy": readiness.healthy_backends,
    }
    if readiness.discovery_errors:  # still ready: those pools keep the members last seen
        answer["discovery_failing"] = readiness.discovery_errors
    return answer
