"""`draftgate plan`: the planner's predictions, tables and recommendations."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from gateway.cli.common import fail, session

plan_app = typer.Typer(help="The planner: predictions, tables and recommendations.")


@plan_app.command("table")
def plan_table(
    model: Annotated[str, typer.Option(help="Catalog model.")],
    gpu: str = "B200",
    gpu_count: Annotated[int, typer.Option(min=1)] = 1,
    workload: str = "chat",
    price: Annotated[float | None, typer.Option(help="USD per GPU-hour.")] = None,
    engine: Annotated[str, typer.Option(help="vllm or sglang.")] = "vllm",
) -> None:
    """Methods x concurrency: tok/s, ITL and $/1M at each method's best K (* = measured).

    A longer block is shown only where it pays by 2%, as `plan recommend` chooses.

    Predictions are fitted to the measurements stored in DRAFTGATE_DATABASE_URL, if any.
    """
    from gateway.services.plans import measured_grid
    from planner import catalog

    try:
        spec, hardware = catalog.model(model), catalog.gpu(gpu)
        usd = price or catalog.default_price(hardware.name).usd_per_gpu_hour
    except (catalog.UnknownCatalogEntry, KeyError) as exc:
        fail(str(exc).strip("'\""))
    from planner.recommend import DoesNotFit

    with session() as db:
        try:
            points, measured, fitted = measured_grid(
                db, spec, hardware, gpu_count, workload, usd, _engine(engine)
            )
        except DoesNotFit as exc:
            fail(str(exc))
    from planner.recommend import best_per_method

    curves = best_per_method(points, None)
    best = {(method, p.concurrency): p for method, curve in curves.items() for p in curve}
    band = "" if fitted.error_band is None else f", fit error +-{fitted.error_band:.0%}"
    typer.echo(
        f"{spec.name} on {gpu_count}x {hardware.name} at ${usd:.2f}/GPU-hour, {workload} "
        f"traffic; {fitted.points} measurements{band}; K = best per cell"
    )
    typer.echo(f"{'method':<8} {'c':>4} {'K':>2} {'tok/s':>10} {'ITL ms':>8} {'$/1M':>8}")
    for (method, c), p in sorted(best.items()):
        seen = measured.get((p.method, p.k, float(c)))
        tps = f"{seen * gpu_count:.0f}*" if seen is not None else f"{p.output_tokens_per_s:.0f} "
        typer.echo(f"{method:<8} {c:>4} {p.k:>2} {tps:>10} {p.itl_ms:>8.2f} {p.usd_per_mtok:>8.3f}")
    from planner.recommend import borrowed_notes

    for line in borrowed_notes(points):
        typer.echo(line)


@plan_app.command("recommend")
def plan_recommend(
    model: Annotated[str, typer.Option(help="Catalog model.")],
    gpu: str = "B200",
    gpu_count: Annotated[int, typer.Option(min=1)] = 1,
    workload: str = "chat",
    itl_objective_ms: Annotated[float | None, typer.Option(min=0)] = None,
    price: Annotated[float | None, typer.Option(help="USD per GPU-hour.")] = None,
    engine: Annotated[str, typer.Option(help="vllm or sglang.")] = "vllm",
) -> None:
    """The best method and K per concurrency, crossovers, and vLLM's K schedule."""
    from planner.recommend import (
        best_per_concurrency,
        borrowed_notes,
        cliffs,
        crossovers,
        grid,
        k_schedule,
    )

    points = _plan_grid(grid, model, gpu, gpu_count, workload, price, _engine(engine))
    choices = best_per_concurrency(points, itl_objective_ms)
    for line in borrowed_notes(points):
        typer.echo(line)
    typer.echo(f"{'c':>4} {'best':<8} {'K':>2} {'tok/s':>9} {'vs plain':>8} {'$/1M':>8}")
    for ch in choices:
        gain = ch.best.output_tokens_per_s / ch.plain.output_tokens_per_s
        b = ch.best
        row = f"{ch.concurrency:>4} {b.method:<8} {b.k:>2} {b.output_tokens_per_s:>9.0f} "
        typer.echo(row + f"{gain:>7.2f}x {b.usd_per_mtok:>8.3f}")
    for c, before, after in crossovers(choices):
        typer.echo(f"crossover at c={c}: {before} -> {after}")
    method = max((ch.best.method for ch in choices), key=[ch.best.method for ch in choices].count)
    if method != "plain":
        schedule = k_schedule(points, method)
        typer.echo(f"{method} num_speculative_tokens_per_batch_size: {[list(s) for s in schedule]}")
        for warning in cliffs(points, schedule, method):
            typer.echo(f"warning: {warning}")


def _engine(name: str) -> str:
    """The engine name, or a one-line error naming the calibrated ones."""
    from planner import calibration

    if name not in calibration.engines():
        fail(f"unknown engine {name!r}; known: {', '.join(calibration.engines())}")
    return name


def _plan_grid(
    grid: Any, model: str, gpu: str, count: int, workload: str, price: float | None, engine: str
) -> Any:
    from planner import calibration
    from planner.catalog import UnknownCatalogEntry
    from planner.recommend import DoesNotFit

    try:
        return grid(
            model,
            gpu,
            gpu_count=count,
            workload=workload,
            price_usd_per_gpu_hour=price,
            cal=calibration.engine_calibration(engine),
        )
    except (UnknownCatalogEntry, KeyError) as exc:
        fail(str(exc).strip("'\""))
    except DoesNotFit as exc:
        fail(str(exc))


@plan_app.command("predict")
def plan_predict(
    input_path: Annotated[Path, typer.Option("--input", help="Scenario JSON ('-' for stdin).")],
) -> None:
    """Predict throughput, speedup, ITL and $/1M tokens for a scenario; print JSON."""
    import json

    from planner.predict import PlanError, parse_scenario, predict, predictions_json

    try:
        text = sys.stdin.read() if str(input_path) == "-" else input_path.read_text()
        raw = json.loads(text)
    except (OSError, json.JSONDecodeError) as exc:
        fail(f"cannot read scenario {input_path}: {exc}")
    if not isinstance(raw, dict):
        fail("the scenario must be a JSON object")
    try:
        forecast = predict(parse_scenario(raw))
    except PlanError as exc:
        fail(str(exc))
    typer.echo(json.dumps(predictions_json(forecast), indent=2))
