"""Admin API for the lossless watchdog: served answers against their reference replays."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from gateway.deps import ActorDep, SessionDep
from gateway.schemas.reports import Instant, LosslessReport
from gateway.schemas.resources import ListOf, QuarantinePublic
from gateway.services.lossless import lossless
from gateway.services.quarantine import lift, listed

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


@router.get("/quarantines")
def get_quarantines(
    session: SessionDep, model: str | None = None, include_lifted: bool = False
) -> ListOf[QuarantinePublic]:
    """Methods the watchdog took out of `auto`'s choices, newest first; lifted ones only when
    asked."""
    rows = listed(session, model, include_lifted)
    return ListOf[QuarantinePublic](data=[QuarantinePublic.model_validate(r) for r in rows])


@router.delete("/quarantines/{quarantine_id}")
def delete_quarantine(quarantine_id: int, session: SessionDep, actor: ActorDep) -> QuarantinePublic:
    """Lift a quarantine: `auto` may choose the method again, judged by later checks only."""
    return QuarantinePublic.model_validate(lift(session, quarantine_id, actor))
