"""Admin API for savings: capacity cost against plain decoding, from the hourly rollups only."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from gateway.deps import SessionDep
from gateway.schemas.reports import Instant, SavingsReport
from gateway.services.savings import savings

router = APIRouter(prefix="/savings", tags=["savings"])


@router.get("")
def get_savings(
    session: SessionDep,
    start: Annotated[Instant | None, Query(alias="from")] = None,
    end: Annotated[Instant | None, Query(alias="to")] = None,
    group_by: str = "model,method",
) -> SavingsReport:
    """Tokens, cost, plain-decoding baseline and savings per group over [from, to)."""
    return savings(session, start, end, group_by)
