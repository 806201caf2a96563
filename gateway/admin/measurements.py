"""Admin API for measurements: the performance points the planner fits to, newest first."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from sqlalchemy import select

from gateway.db.tables import Measurement
from gateway.deps import SessionDep
from gateway.schemas import ListOf, MeasurementPublic

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
    query = select(Measurement).order_by(Measurement.id.desc()).limit(limit)
    if model is not None:
        query = query.where(Measurement.model == model)
    if backend is not None:
        query = query.where(Measurement.backend_name == backend)
    if source is not None:
        query = query.where(Measurement.source == source)
    rows = session.scalars(query)
    return ListOf[MeasurementPublic](data=[MeasurementPublic.model_validate(r) for r in rows])
