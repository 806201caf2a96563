"""Admin API for actual spend: GPU-hours each backend was held (idle included) times its price."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from gateway.deps import SessionDep
from gateway.schemas.reports import Instant, SpendReport
from gateway.services.spend import spend

router = APIRouter(prefix="/spend", tags=["savings"])


@router.get("")
def get_spend(
    session: SessionDep,
    start: Annotated[Instant | None, Query(alias="from")] = None,
    end: Annotated[Instant | None, Query(alias="to")] = None,
    price_kind: str = "on-demand",
) -> SpendReport:
    """GPU-hours held and their cost per backend over [start, end)."""
    return spend(session, start, end, price_kind)
