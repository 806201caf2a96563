"""Admin API for the planner: best method and K per load for a model on a GPU, with costs."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from gateway.deps import SessionDep
from gateway.schemas.reports import AccuracyReport, PlanReport
from gateway.services import plans

router = APIRouter(prefix="/plan", tags=["plan"])
accuracy_router = APIRouter(prefix="/accuracy", tags=["plan"])


@router.get("")
def get_plan(
    session: SessionDep,
    model: str,
    gpu: str = "B200",
    gpu_count: Annotated[int, Query(ge=1, le=1024)] = 1,
    workload: str = "chat",
    itl_objective_ms: Annotated[float | None, Query(gt=0)] = None,
    price_kind: str = "on-demand",
    output_tokens_per_s: Annotated[float | None, Query(gt=0)] = None,
    engine: str = "vllm",
) -> PlanReport:
    """Per concurrency: the best method and K within the ITL objective, and its cost.

    `engine` (vllm or sglang) picks the scheduling and calibration the predictions assume.
    """
    return plans.build_plan(
        session,
        model,
        gpu,
        gpu_count,
        workload,
        itl_objective_ms,
        price_kind,
        output_tokens_per_s,
        engine,
    )


@accuracy_router.get("")
def get_accuracy(session: SessionDep, workload: str = "chat") -> AccuracyReport:
    """Every measured point beside the planner's prediction from a fit that did not see it."""
    return plans.accuracy(session, workload)
