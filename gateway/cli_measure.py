"""`draftgate bench` and `draftgate import`: measurements from load sweeps and result files."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from gateway.cli_common import fail, session

DEFAULT_BENCH_REQUESTS = 50  # per level, when neither --requests nor --duration is given
import_app = typer.Typer(help="Benchmark results from other tools, as measurements.")


def bench(
    url: Annotated[str, typer.Option(help="Server base URL (without /v1).")],
    model: Annotated[str, typer.Option(help="Model name to request.")],
    concurrency: Annotated[str, typer.Option(help="Comma-separated levels.")] = "1,4,16,64",
    requests: Annotated[int | None, typer.Option(min=1, help="Requests per level.")] = None,
    duration: Annotated[float | None, typer.Option(min=0.1, help="Seconds per level.")] = None,
    input_len: Annotated[int, typer.Option(min=1)] = 128,
    output_len: Annotated[int, typer.Option(min=1)] = 128,
    api_key: Annotated[str | None, typer.Option(envvar="DRAFTGATE_BENCH_API_KEY")] = None,
    save_result: Annotated[
        Path | None, typer.Option(help="vllm-bench JSON (one per level).")
    ] = None,
    method: Annotated[
        str | None, typer.Option(help="Store results as measurements: method.")
    ] = None,
    k: Annotated[int, typer.Option(min=0)] = 0,
    gpu: Annotated[str | None, typer.Option(help="Store results: GPU type.")] = None,
    gpu_count: Annotated[int, typer.Option(min=1)] = 1,
) -> None:
    """A closed-loop load sweep: client TTFT, ITL, end-to-end, tokens/s, and acceptance."""
    import asyncio

    from backends.bench import BenchConfig, run_sweep

    try:
        levels = tuple(int(c) for c in concurrency.split(","))
    except ValueError:
        fail(f"--concurrency must be integers separated by commas, got {concurrency!r}")
    if (method is None) != (gpu is None):
        fail("--method and --gpu go together (they describe the measured server)")
    if requests is None and duration is None:
        requests = DEFAULT_BENCH_REQUESTS
    seconds = duration if requests is None else None
    config = BenchConfig(url.rstrip("/"), model, levels, requests, seconds, input_len,
                         output_len, api_key)  # fmt: skip
    results = asyncio.run(run_sweep(config, lambda line: typer.echo(line, err=True)))
    _print_levels(results)
    if save_result is not None:
        _save_levels(save_result, config, results)
    if method is not None and gpu is not None:
        _store_levels(results, model, method, k, gpu, gpu_count)


def _print_levels(results: list[Any]) -> None:
    typer.echo(f"{'c':>4} {'done':>5} {'fail':>4} {'tok/s':>9} {'TTFT ms':>8} {'ITL ms':>7} "
               f"{'e2e ms':>8} {'AL':>5}")  # fmt: skip
    for r in results:
        al = "-" if r.acceptance_length is None else f"{r.acceptance_length:.2f}"
        typer.echo(f"{r.concurrency:>4} {r.completed:>5} {r.failed:>4} "
                   f"{r.output_tokens_per_s:>9.0f} {_mean(r.ttft_ms):>8.1f} "
                   f"{_mean(r.itl_ms):>7.2f} {_mean(r.e2e_ms):>8.0f} {al:>5}")  # fmt: skip


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def _save_levels(path: Path, config: Any, results: list[Any]) -> None:
    import json

    from backends.bench import vllm_bench_json

    for r in results:
        target = (
            path
            if len(results) == 1
            else path.with_name(f"{path.stem}-c{r.concurrency}{path.suffix}")
        )
        target.write_text(json.dumps(vllm_bench_json(config, r), indent=2))
        typer.echo(f"saved {target}", err=True)


def _store_levels(
    results: list[Any], model: str, method: str, k: int, gpu: str, count: int
) -> None:
    from gateway.benchmarks import level_measurement

    backend = {"model": model, "method": method, "k": k, "gpu_type": gpu, "gpu_count": count}
    with session() as db:
        db.add_all(level_measurement(r, backend) for r in results if r.completed)
    typer.echo(f"stored {sum(1 for r in results if r.completed)} measurement(s)", err=True)


Method = Annotated[str, typer.Option(help="The method the server ran.")]
Gpu = Annotated[str, typer.Option(help="GPU type the server ran on.")]
K = Annotated[int, typer.Option(min=0, help="Speculative tokens (0 for plain).")]
GpuCount = Annotated[int, typer.Option(min=1)]


@import_app.command("vllm-bench")
def import_vllm_bench(
    files: Annotated[list[Path], typer.Argument(help="`vllm bench serve --save-result` JSON.")],
    method: Method,
    gpu: Gpu,
    k: K = 0,
    gpu_count: GpuCount = 1,
    model: Annotated[str | None, typer.Option(help="When the file has no model_id.")] = None,
    concurrency: Annotated[float | None, typer.Option(help="When the file has none.")] = None,
) -> None:
    """Import result files as measurements (source import); all or nothing."""
    from backends.importers import read_vllm_bench

    _import(lambda f: [read_vllm_bench(f, model=model, concurrency=concurrency)], files,
            method, k, gpu, gpu_count)  # fmt: skip


@import_app.command("guidellm")
def import_guidellm(
    files: Annotated[list[Path], typer.Argument(help="GuideLLM JSON reports.")],
    model: Annotated[str, typer.Option(help="The model the server served.")],
    method: Method,
    gpu: Gpu,
    k: K = 0,
    gpu_count: GpuCount = 1,
) -> None:
    """Import GuideLLM reports, one measurement per benchmark; all or nothing."""
    from backends.importers import read_guidellm

    _import(lambda f: read_guidellm(f, model=model), files, method, k, gpu, gpu_count)


def _import(
    read: Callable[[Path], list[Any]],
    files: list[Path],
    method: str,
    k: int,
    gpu: str,
    gpu_count: int,
) -> None:
    """Read every file first, then store all its points in one transaction."""
    from backends.importers import ImportRejected
    from backends.methods import METHODS
    from gateway.db.tables import Measurement

    if method not in METHODS:
        fail(f"unknown method {method!r}; known: {', '.join(METHODS)}")
    try:
        points = [point for f in files for point in read(f)]
    except ImportRejected as exc:
        fail(f"nothing imported: {exc}")
    with session() as db:
        db.add_all(
            Measurement(model=p.model, method=method, k=k, gpu_type=gpu, gpu_count=gpu_count,
                        concurrency=p.concurrency, output_tokens_per_s=p.output_tokens_per_s,
                        mean_acceptance_length=p.mean_acceptance_length,
                        acceptance_per_position=p.acceptance_per_position, ttft_ms=p.ttft_ms,
                        itl_ms=p.itl_ms, source="import")
            for p in points
        )  # fmt: skip
    typer.echo(f"imported {len(points)} measurement(s)")
