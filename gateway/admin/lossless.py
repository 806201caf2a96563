"""Admin API for the lossless watchdog: served answers against their reference replays."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from gateway.deps import SessionDep
from gateway.schemas.reports import Instant, LosslessReport
from gateway.services.lossless import lossless

router = APIRouter(prefix="/lossless", tags=["lossless"])


@router.get("")
def get_lossless(
    session: SessionDep,
    start: Annotated[Instant | None, Query(alias="from")] = None,
    end: Annotated[Instant | None, Query(alias="to")] = None,
    model: str | None = None,
) -> LosslessReport:
    """Served answers against their replays on the reference method, per model and group.

    Over [from, to) (the last 30 days by default): each serving configuration's divergence
    rate with its 95% interval and where answers first differ, each model's floor (a method
    against itself) to read them beside, and what the replays cost."""
    return lossless(session, start, end, model)
