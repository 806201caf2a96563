"""The planner over stored measurements: the plan per model and GPU, and its held-out accuracy."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace

from sqlalchemy.orm import Session

from gateway.curves import CALIBRATED_ERROR, MEAN_ERROR_TO_95, OUT_OF_SAMPLE_ERROR
from gateway.db import measurements, queries
from gateway.db.tables import Measurement
from gateway.errors import NotFound, ValidationFailed
from gateway.schemas.reports import (
    AccuracyPoint,
    AccuracyReport,
    CapacityPlan,
    Crossover,
    MethodCapacity,
    PlanChoice,
    PlanFit,
    PlanPoint,
    PlanPrice,
    PlanReport,
)
from planner import calibration, catalog
from planner.capacity import HOURS_PER_MONTH, Capacity, plan_capacity, savings
from planner.catalog import UnknownCatalogEntry
from planner.cost import usd_per_mtok
from planner.fit_measurements import (
    FittedModel,
    Hardware,
    MeasuredPoint,
    fit_measurements,
    held_out_predictions,
)
from planner.recommend import (
    DoesNotFit,
    Point,
    best_per_concurrency,
    best_per_method,
    crossovers,
    grid,
    k_schedule,
)

DEFAULT_ITL_OBJECTIVE_MS = 50.0  # about 20 tokens/s per user, a common interactive floor
Measured = dict[tuple[str, int, float], float]  # tokens/s per GPU by (method, K, concurrency)


def check_workload(workload: str) -> None:
    """Raise ValidationFailed naming the known workloads."""
    if workload not in calibration.workloads():
        known = ", ".join(calibration.workloads())
        raise ValidationFailed(f"unknown workload {workload!r}; known: {known}", param="workload")


def check_engine(engine: str) -> None:
    """Raise ValidationFailed naming the calibrated engines."""
    if engine not in calibration.engines():
        known = ", ".join(calibration.engines())
        raise ValidationFailed(f"unknown engine {engine!r}; known: {known}", param="engine")


def plan_price(session: Session, gpu: str, kind: str) -> PlanPrice:
    """The price the plan assumes: the database's, else the shipped default."""
    row = queries.find_price(session, gpu, kind)
    if row is not None:
        return PlanPrice(
            usd_per_gpu_hour=row.usd_per_gpu_hour,
            kind=kind,
            source=row.source,
            date=row.date.isoformat(),
            origin="database",
        )
    default = catalog.default_price(gpu, kind)  # type: ignore[arg-type]
    return PlanPrice(
        usd_per_gpu_hour=default.usd_per_gpu_hour,
        kind=kind,
        source=default.source,
        date=default.date.isoformat(),
        origin="default",
    )


def _by_config(points: list[MeasuredPoint]) -> Measured:
    """Mean measured output tokens/s per GPU by (method, K, concurrency)."""
    sums: dict[tuple[str, int, float], list[float]] = {}
    for p in points:
        sums.setdefault((p.method, p.k, float(p.concurrency)), []).append(p.output_tokens_per_s)
    return {key: sum(v) / len(v) for key, v in sums.items()}


def relative_95(fitted: FittedModel) -> float:
    """The plan's relative 95% half-width, from its fit's held-out error."""
    if fitted.error_band is None:
        return MEAN_ERROR_TO_95 * OUT_OF_SAMPLE_ERROR
    return MEAN_ERROR_TO_95 * max(fitted.error_band, CALIBRATED_ERROR)


def _point(p: Point, measured: Measured, gpu_count: int, half: float) -> PlanPoint:
    seen = measured.get((p.method, p.k, float(p.concurrency)))
    return PlanPoint(
        method=p.method,
        k=p.k,
        concurrency=p.concurrency,
        output_tokens_per_s=p.output_tokens_per_s,
        itl_ms=p.itl_ms,
        usd_per_mtok=p.usd_per_mtok,
        usd_per_mtok_95=(p.usd_per_mtok * max(1 - half, 0.0), p.usd_per_mtok * (1 + half)),
        measured_output_tokens_per_s=None if seen is None else seen * gpu_count,
        source="measured" if seen is not None else "estimated",
        acceptance_borrowed_from=p.borrowed_from,
    )


def measured_grid(
    session: Session,
    spec: catalog.ModelSpec,
    hardware: catalog.GpuSpec,
    gpu_count: int,
    workload: str,
    usd_per_gpu_hour: float,
    engine: str = calibration.DEFAULT_ENGINE,
) -> tuple[list[Point], Measured, FittedModel]:
    """The planner's grid fitted to this (model, GPU)'s stored measurements, and those."""
    observed = observed_per_gpu(session, spec, hardware)
    return fitted_grid(observed, spec, hardware, gpu_count, workload, usd_per_gpu_hour, engine)


def observed_per_gpu(
    session: Session, spec: catalog.ModelSpec, hardware: catalog.GpuSpec
) -> list[MeasuredPoint]:
    """This (model, GPU)'s stored measurements, per GPU."""
    return [per_gpu(r) for r in measurements.on_gpu(session, spec.name, hardware.name)]


def fitted_grid(
    observed: list[MeasuredPoint],
    spec: catalog.ModelSpec,
    hardware: catalog.GpuSpec,
    gpu_count: int,
    workload: str,
    usd_per_gpu_hour: float,
    engine: str = calibration.DEFAULT_ENGINE,
) -> tuple[list[Point], Measured, FittedModel]:
    """The planner's grid fitted to `observed` (per GPU), and those by configuration (pure)."""
    fitted = fit_measurements(
        Hardware(spec, hardware, 1, calibration.workloads()[workload]),
        observed,
        calibration.engine_calibration(engine),
    )
    points = grid(
        spec.name,
        hardware.name,
        gpu_count=gpu_count,
        workload=workload,
        price_usd_per_gpu_hour=usd_per_gpu_hour,
        cal=fitted.calibration,
    )
    measured = _by_config(observed)
    return _honoured(points, measured, gpu_count, usd_per_gpu_hour), measured, fitted


def _honoured(
    points: list[Point], measured: Measured, gpu_count: int, usd_per_gpu_hour: float
) -> list[Point]:
    """The grid with each measured (method, K, concurrency) at its measurement: what is
    chosen, sized and labelled "measured" is the measurement, not the fit's value there.
    A method measured on this model is no longer priced with another's acceptance."""
    seen_methods = {method for method, _, _ in measured}
    out = []
    for p in points:
        if p.method in seen_methods:
            p = replace(p, borrowed_from=None)
        seen = measured.get((p.method, p.k, float(p.concurrency)))
        if seen is not None and seen > 0:
            tps = seen * gpu_count
            p = replace(
                p,
                output_tokens_per_s=tps,
                itl_ms=p.itl_ms * p.output_tokens_per_s / tps,
                usd_per_mtok=usd_per_mtok(usd_per_gpu_hour, gpu_count, tps),
            )
        out.append(p)
    return out


@dataclass(frozen=True, slots=True)
class PlanRequest:
    """What a plan is asked for, beside the model and the GPU."""

    gpu_count: int
    workload: str
    itl_objective_ms: float | None
    output_tokens_per_s: float | None  # a traffic to size a fleet for, if any
    engine: str


def build_plan(
    session: Session,
    model: str,
    gpu: str,
    gpu_count: int,
    workload: str,
    itl_objective_ms: float | None,
    price_kind: str,
    output_tokens_per_s: float | None,
    engine: str = calibration.DEFAULT_ENGINE,
) -> PlanReport:
    """Per concurrency: the best method and K within the ITL objective, and its cost."""
    check_workload(workload)
    check_engine(engine)
    try:
        spec, hardware = catalog.model(model), catalog.gpu(gpu)
        price = plan_price(session, hardware.name, price_kind)
    except UnknownCatalogEntry as exc:
        raise NotFound(str(exc), param="model" if "model" in str(exc) else "gpu") from None
    observed = observed_per_gpu(session, spec, hardware)
    request = PlanRequest(gpu_count, workload, itl_objective_ms, output_tokens_per_s, engine)
    return plan_report(spec, hardware, price, observed, request)


def plan_report(
    spec: catalog.ModelSpec,
    hardware: catalog.GpuSpec,
    price: PlanPrice,
    observed: list[MeasuredPoint],
    request: PlanRequest,
) -> PlanReport:
    """The plan from the measurements (per GPU) and the price it assumes (pure)."""
    usd, gpu_count, objective = price.usd_per_gpu_hour, request.gpu_count, request.itl_objective_ms
    try:
        points, measured, fitted = fitted_grid(
            observed, spec, hardware, gpu_count, request.workload, usd, request.engine
        )
    except DoesNotFit as exc:
        raise ValidationFailed(str(exc), param="gpu_count") from None
    choices = best_per_concurrency(points, objective)
    methods = sorted({c.best.method for c in choices} - {"plain"})
    half = relative_95(fitted)
    capacity = None
    if request.output_tokens_per_s is not None:
        capacity = _capacity(points, request.output_tokens_per_s, objective, gpu_count, usd, half)
    return PlanReport(
        fit=PlanFit(measurements=fitted.points, error_band=fitted.error_band, relative_95=half),
        capacity=capacity,
        model=spec.name,
        gpu=hardware.name,
        gpu_count=gpu_count,
        workload=request.workload,
        engine=request.engine,
        itl_objective_ms=objective,
        price=price,
        choices=[
            PlanChoice(
                **_point(c.best, measured, gpu_count, half).model_dump(),
                speedup_vs_plain=c.best.output_tokens_per_s / c.plain.output_tokens_per_s,
            )
            for c in choices
        ],
        crossovers=[
            Crossover(concurrency=c, from_method=a, to_method=b) for c, a, b in crossovers(choices)
        ],
        methods={
            m: [_point(p, measured, gpu_count, half) for p in curve]
            for m, curve in best_per_method(points, objective).items()
        },
        schedules={m: [list(s) for s in k_schedule(points, m)] for m in methods},
    )


def _capacity(
    points: list[Point],
    output_tokens_per_s: float,
    itl_objective_ms: float | None,
    gpu_count: int,
    usd_per_gpu_hour: float,
    half: float,
) -> CapacityPlan:
    """GPUs and $/month per method for a traffic, and savings against plain and EAGLE-3,
    each with its interval: the replica at the fast and the slow end of the fit's band."""
    objective = itl_objective_ms or DEFAULT_ITL_OBJECTIVE_MS
    plans = plan_capacity(
        points,
        output_tokens_per_s=output_tokens_per_s,
        itl_objective_ms=objective,
        gpu_count=gpu_count,
        price_usd_per_gpu_hour=usd_per_gpu_hour,
    )
    per_replica = HOURS_PER_MONTH * gpu_count * usd_per_gpu_hour
    ends = {c.method: _monthly_ends(c, output_tokens_per_s, per_replica, half) for c in plans}
    return CapacityPlan(
        output_tokens_per_s=output_tokens_per_s,
        itl_objective_ms=objective,
        methods=[
            MethodCapacity.model_validate({**asdict(c), "usd_per_month_95": ends[c.method]})
            for c in plans
        ],
        savings_usd_per_month={
            "vs_plain": savings(plans, "plain"),
            "vs_eagle3": savings(plans, "eagle3"),
        },
        savings_usd_per_month_95={
            name: {m: _difference(ends, base, m) for m in ends}
            for name, base in (("vs_plain", "plain"), ("vs_eagle3", "eagle3"))
            if base in ends
        },
    )


Ends = tuple[float, float] | None


def _monthly_ends(c: Capacity, demand: float, per_replica: float, half: float) -> Ends:
    """The monthly bill with the replica at the fast and at the slow end of the band (None:
    the slow end has no throughput)."""
    if half >= 1:
        return None
    tps = c.output_tokens_per_s_per_replica
    fast, slow = (math.ceil(demand / (tps * f)) * per_replica for f in (1 + half, 1 - half))
    return fast, slow


def _difference(ends: Mapping[str, Ends], base: str, method: str) -> Ends:
    """The interval of base's bill minus the method's (exactly 0 against itself)."""
    if method == base:
        return 0.0, 0.0
    b, m = ends[base], ends[method]
    return None if b is None or m is None else (b[0] - m[1], b[1] - m[0])


def accuracy(session: Session, workload: str) -> AccuracyReport:
    """Every measured point beside the planner's prediction from a fit that did not see it."""
    check_workload(workload)
    points: list[AccuracyPoint] = []
    for (model, gpu), rows in sorted(measurements.by_hardware(session).items()):
        try:
            hw = Hardware(
                catalog.model(model), catalog.gpu(gpu), 1, calibration.workloads()[workload]
            )
        except UnknownCatalogEntry:
            continue  # not a catalogued model or GPU: nothing to predict it from
        measured = [per_gpu(r) for r in rows]
        held_out = held_out_predictions(hw, measured)
        predicted: list[float | None] = list(held_out) if held_out else [None] * len(rows)
        for row, point, guess in zip(rows, measured, predicted, strict=True):
            error = None if guess is None else guess / point.output_tokens_per_s - 1
            points.append(
                AccuracyPoint(
                    model=model,
                    gpu_type=gpu,
                    method=row.method,
                    k=row.k,
                    concurrency=row.concurrency,
                    source=row.source,
                    measured_output_tokens_per_s=point.output_tokens_per_s,
                    predicted_output_tokens_per_s=guess,
                    error=error,
                )
            )
    errors = [abs(p.error) for p in points if p.error is not None]
    mean = sum(errors) / len(errors) if errors else None
    return AccuracyReport(points=points, mean_absolute_error=mean, predicted=len(errors))


def per_gpu(r: Measurement) -> MeasuredPoint:
    """A stored measurement as the planner fits it: output tokens/s per GPU."""
    return MeasuredPoint(
        r.method, r.k, r.concurrency, r.output_tokens_per_s / r.gpu_count, r.mean_acceptance_length
    )
