"""Admin API for measurements: the performance points the planner fits to, newest first."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from gateway.db import measurements
from gateway.deps import SessionDep
from gateway.schemas.resources import ListOf, MeasurementPublic

router = APIRouter(prefix="/measurements", tags=["measurements"])


@router.get("")
def list_measurements(
    session: SessionDep,
    model: str | None = None,
    backend: str | None = None,
    source: str | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> ListOf[MeasurementPublic]:
    """Stored measurements, newest first, optionally of one model, backend or source."""
    rows = measurements.newest(session, model, backend, source, limit)
    return ListOf[MeasurementPublic](data=[MeasurementPublic.model_validate(r) for r in rows])
