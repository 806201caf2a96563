"""Admin API for the fleet: the bill, right-sized bills per method, savings that are money."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from gateway.deps import ComponentsDep, SessionDep
from gateway.schemas.reports import FleetReport, Instant
from gateway.services.rightsizing import Sizing, fleet_report

router = APIRouter(prefix="/fleet", tags=["savings"])


@router.get("")
def get_fleet(
    session: SessionDep,
    components: ComponentsDep,
    model: str,
    start: Annotated[Instant | None, Query(alias="from")] = None,
    end: Annotated[Instant | None, Query(alias="to")] = None,
    price_kind: str = "on-demand",
    objective_ms: Annotated[float | None, Query(gt=0, le=10_000)] = None,
) -> FleetReport:
    """The model's bill over [from, to), what fleets sized for its traffic would cost per
    method, the achievable savings, the over-provisioning and the replicas wanted now.
    `objective_ms`: size the fleets for this ITL objective instead of the policy's (a
    what-if: no policy changes)."""
    registry = components.registry
    return fleet_report(
        session,
        registry.snapshot,
        registry.choices.fleet_now.get(model),
        model,
        start,
        end,
        price_kind,
        Sizing.of(components.settings),
        objective_ms,
    )
