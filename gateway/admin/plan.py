"""Admin API for the planner: best method and K per load for a model on a GPU, with costs."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from sqlalchemy import select
from sqlalchemy.orm import Session

from gateway.db import queries
from gateway.db.tables import Measurement
from gateway.deps import SessionDep
from gateway.errors import NotFound, ValidationFailed
from planner import calibration, catalog
from planner.capacity import plan_capacity, savings
from planner.catalog import UnknownCatalogEntry
from planner.fit_measurements import (
    FittedModel,
    Hardware,
    MeasuredPoint,
    fit_measurements,
    held_out_predictions,
)
from planner.recommend import (
    Point,
    best_per_concurrency,
    best_per_method,
    crossovers,
    grid,
    k_schedule,
)

router = APIRouter(prefix="/plan", tags=["plan"])


def _price(session: Session, gpu: str, kind: str) -> dict[str, Any]:
    """The price the plan assumes: the database's, else the shipped default."""
    row = queries.find_price(session, gpu, kind)
    if row is not None:
        return {"usd_per_gpu_hour": row.usd_per_gpu_hour, "kind": kind, "source": row.source,
                "date": row.date.isoformat(), "origin": "database"}  # fmt: skip
    default = catalog.default_price(gpu, kind)  # type: ignore[arg-type]
    return {"usd_per_gpu_hour": default.usd_per_gpu_hour, "kind": kind, "source": default.source,
            "date": default.date.isoformat(), "origin": "default"}  # fmt: skip


def _measurements(session: Session, model: str, gpu: str) -> list[MeasuredPoint]:
    """The measurements of `model` on `gpu`, per GPU (tokens/s divided by the GPU count)."""
    rows = session.scalars(
        select(Measurement).where(Measurement.model == model, Measurement.gpu_type == gpu)
    )
    return [
        MeasuredPoint(r.method, r.k, r.concurrency, r.output_tokens_per_s / r.gpu_count,
                      r.mean_acceptance_length)
        for r in rows
    ]  # fmt: skip


def _by_config(points: list[MeasuredPoint]) -> dict[tuple[str, int, float], float]:
    """Mean measured output tokens/s per GPU by (method, K, concurrency)."""
    sums: dict[tuple[str, int, float], list[float]] = {}
    for p in points:
        sums.setdefault((p.method, p.k, float(p.concurrency)), []).append(p.output_tokens_per_s)
    return {key: sum(v) / len(v) for key, v in sums.items()}


def _point_json(
    p: Point, measured: dict[tuple[str, int, float], float], count: int
) -> dict[str, Any]:
    seen = measured.get((p.method, p.k, float(p.concurrency)))
    return {
        "method": p.method, "k": p.k, "concurrency": p.concurrency,
        "output_tokens_per_s": p.output_tokens_per_s, "itl_ms": p.itl_ms,
        "usd_per_mtok": p.usd_per_mtok,
        "measured_output_tokens_per_s": None if seen is None else seen * count,
        "source": "measured" if seen is not None else "estimated",
    }  # fmt: skip


def measured_grid(
    session: Session,
    spec: catalog.ModelSpec,
    hardware: catalog.GpuSpec,
    gpu_count: int,
    workload: str,
    usd_per_gpu_hour: float,
) -> tuple[list[Point], dict[tuple[str, int, float], float], FittedModel]:
    """The planner's grid fitted to this (model, GPU)'s stored measurements, and those."""
    observed = _measurements(session, spec.name, hardware.name)
    fitted = fit_measurements(Hardware(spec, hardware, 1, calibration.workloads()[workload]),
                              observed)  # fmt: skip
    points = grid(spec.name, hardware.name, gpu_count=gpu_count, workload=workload,
                  price_usd_per_gpu_hour=usd_per_gpu_hour, cal=fitted.calibration)  # fmt: skip
    return points, _by_config(observed), fitted


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
) -> dict[str, Any]:
    """Per concurrency: the best method and K within the ITL objective, and its cost."""
    if workload not in calibration.workloads():
        known = ", ".join(calibration.workloads())
        raise ValidationFailed(f"unknown workload {workload!r}; known: {known}", param="workload")
    try:
        spec, hardware = catalog.model(model), catalog.gpu(gpu)
        price = _price(session, hardware.name, price_kind)
    except UnknownCatalogEntry as exc:
        raise NotFound(str(exc), param="model" if "model" in str(exc) else "gpu") from None
    usd = price["usd_per_gpu_hour"]
    points, measured, fitted = measured_grid(session, spec, hardware, gpu_count, workload, usd)
    choices = best_per_concurrency(points, itl_objective_ms)
    methods = sorted({c.best.method for c in choices} - {"plain"})
    capacity = None
    if output_tokens_per_s is not None:
        capacity = _capacity(points, output_tokens_per_s, itl_objective_ms, gpu_count, price)
    return {
        "fit": {"measurements": fitted.points, "error_band": fitted.error_band},
        "capacity": capacity,
        "model": spec.name, "gpu": hardware.name, "gpu_count": gpu_count,
        "workload": workload, "itl_objective_ms": itl_objective_ms, "price": price,
        "choices": [
            _point_json(c.best, measured, gpu_count)
            | {"speedup_vs_plain": c.best.output_tokens_per_s / c.plain.output_tokens_per_s}
            for c in choices
        ],
        "crossovers": [{"concurrency": c, "from": a, "to": b} for c, a, b in crossovers(choices)],
        "methods": {m: [_point_json(p, measured, gpu_count) for p in curve]
                    for m, curve in best_per_method(points, itl_objective_ms).items()},
        "schedules": {m: [list(s) for s in k_schedule(points, m)] for m in methods},
    }  # fmt: skip


DEFAULT_ITL_OBJECTIVE_MS = 50.0  # about 20 tokens/s per user, a common interactive floor


def _capacity(
    points: list[Point],
    output_tokens_per_s: float,
    itl_objective_ms: float | None,
    gpu_count: int,
    price: dict[str, Any],
) -> dict[str, Any]:
    """GPUs and $/month per method for a traffic, and savings against plain and EAGLE-3."""
    objective = itl_objective_ms or DEFAULT_ITL_OBJECTIVE_MS
    plans = plan_capacity(points, output_tokens_per_s=output_tokens_per_s,
                          itl_objective_ms=objective, gpu_count=gpu_count,
                          price_usd_per_gpu_hour=price["usd_per_gpu_hour"])  # fmt: skip
    return {
        "output_tokens_per_s": output_tokens_per_s,
        "itl_objective_ms": objective,
        "methods": [c.__dict__ for c in plans],
        "savings_usd_per_month": {
            "vs_plain": savings(plans, "plain"),
            "vs_eagle3": savings(plans, "eagle3"),
        },
    }


accuracy_router = APIRouter(prefix="/accuracy", tags=["plan"])


@accuracy_router.get("")
def get_accuracy(session: SessionDep, workload: str = "chat") -> dict[str, Any]:
    """Every measured point beside the planner's prediction from a fit that did not see it."""
    if workload not in calibration.workloads():
        known = ", ".join(calibration.workloads())
        raise ValidationFailed(f"unknown workload {workload!r}; known: {known}", param="workload")
    groups: dict[tuple[str, str], list[Measurement]] = {}
    for row in session.scalars(select(Measurement).order_by(Measurement.id)):
        groups.setdefault((row.model, row.gpu_type), []).append(row)
    points, errors = [], []
    for (model, gpu), rows in sorted(groups.items()):
        try:
            hw = Hardware(catalog.model(model), catalog.gpu(gpu), 1,
                          calibration.workloads()[workload])  # fmt: skip
        except UnknownCatalogEntry:
            continue  # not a catalogued model or GPU: nothing to predict it from
        measured = [MeasuredPoint(r.method, r.k, r.concurrency, r.output_tokens_per_s / r.gpu_count,
                                  r.mean_acceptance_length) for r in rows]  # fmt: skip
        held_out = held_out_predictions(hw, measured)
        predicted: list[float | None] = list(held_out) if held_out else [None] * len(rows)
        for row, point, guess in zip(rows, measured, predicted, strict=True):
            error = None if guess is None else guess / point.output_tokens_per_s - 1
            if error is not None:
                errors.append(abs(error))
            points.append({
                "model": model, "gpu_type": gpu, "method": row.method, "k": row.k,
                "concurrency": row.concurrency, "source": row.source,
                "measured_output_tokens_per_s": point.output_tokens_per_s,
                "predicted_output_tokens_per_s": guess, "error": error,
            })  # fmt: skip
    mean = sum(errors) / len(errors) if errors else None
    return {"points": points, "mean_absolute_error": mean, "predicted": len(errors)}
