"""Admin API for the live curves: what prices requests, drives `auto` and sizes the fleet."""

from __future__ import annotations

from fastapi import APIRouter

from gateway.deps import ComponentsDep
from gateway.schemas.reports import CurvesReport
from gateway.services.curves import curves_report

router = APIRouter(prefix="/curves", tags=["plan"])


@router.get("")
def get_curves(
    components: ComponentsDep, model: str | None = None, gpu: str | None = None
) -> CurvesReport:
    """Per (model, method, GPU type): the curve's K, its pooled measured points with their
    requests and spread, the line that prices requests (measured or estimated points, $/1M
    at the on-demand price) and the measurements kept out of it."""
    return curves_report(components.registry.snapshot, model, gpu)
