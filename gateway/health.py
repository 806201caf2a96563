"""Liveness and readiness."""

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
    """The database answers and at least one backend is enabled."""
    try:
        with services.sessions() as session:
            query = select(func.count()).select_from(Backend).where(Backend.enabled)
            enabled = session.scalar(query) or 0
    except SQLAlchemyError as exc:
        raise ServiceUnavailable(f"database unreachable: {type(exc).__name__}") from exc
    if enabled == 0:
        raise ServiceUnavailable("no enabled backend")
    return {"status": "ready", "database": "ok", "backends_enabled": enabled}
