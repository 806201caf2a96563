"""`draftgate bench` and `draftgate import`: measurements from load sweeps and result files."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from gateway.cli.common import fail, session

import_app = typer.Typer(help="Benchmark results from other tools, as measurements.")

# The options of `bench` whose help would not fit beside their name.
Levels = Annotated[
    str, typer.Option(help="Comma-separated levels (with --rate: caps on requests in flight).")
]
Requests = Annotated[
    int | None,
    typer.Option(min=1, help="Requests per level (default: 50, and at least 8 per client)."),
]
Rate = Annotated[float | None, typer.Option(min=0.001, help="Open loop: requests/s per level.")]
Burstiness = Annotated[
    float | None, typer.Option(min=0.001, help="With --poisson: gamma shape (vLLM's).")
]
Temperature = Annotated[
    float | None, typer.Option(min=0, help="Sampling temperature (default: the server's).")
]
SaveResult = Annotated[Path | None, typer.Option(help="vllm-bench JSON (one per level).")]
StoredMethod = Annotated[str | None, typer.Option(help="Store results as measurements: method.")]


def bench(
    url: Annotated[str, typer.Option(help="Server base URL (without /v1).")],
    model: Annotated[str, typer.Option(help="Model name to request.")],
    concurrency: Levels = "1,4,16,64",
    requests: Requests = None,
    duration: Annotated[float | None, typer.Option(min=0.1, help="Seconds per level.")] = None,
    rate: Rate = None,
    poisson: Annotated[bool, typer.Option(help="With --rate: Poisson arrivals.")] = False,
    burstiness: Burstiness = None,
    seed: Annotated[int, typer.Option(min=0, help="Of arrivals and workload.")] = 0,
    temperature: Temperature = None,
    workload: Annotated[str, typer.Option(help="synthetic, code, chat or math.")] = "synthetic",
    input_len: Annotated[int | None, typer.Option(min=1, help="Mean prompt tokens.")] = None,
    output_len: Annotated[int | None, typer.Option(min=1, help="Mean output tokens.")] = None,
    api_key: Annotated[str | None, typer.Option(envvar="DRAFTGATE_BENCH_API_KEY")] = None,
    save_result: SaveResult = None,
    method: StoredMethod = None,
    k: Annotated[int, typer.Option(min=0)] = 0,
    gpu: Annotated[str | None, typer.Option(help="Store results: GPU type.")] = None,
    gpu_count: Annotated[int, typer.Option(min=1)] = 1,
) -> None:
    """A load sweep, closed-loop or at --rate: client TTFT, ITL, end-to-end, tokens/s, and
    acceptance."""
    import asyncio

    from backends.bench import BenchConfig, run_sweep
    from backends.workloads import resolve_lengths

    levels = _checked_levels(concurrency, method, gpu, workload)
    _check_arrivals(rate, poisson, burstiness)
    requests, seconds, per_client = _level_length(requests, duration)
    prompt_len, answer_len = resolve_lengths(workload, input_len, output_len)
    config = BenchConfig(
        url.rstrip("/"),
        model,
        levels,
        requests,
        seconds,
        requests_per_client=per_client,
        api_key=api_key,
        input_len=prompt_len,
        output_len=answer_len,
        rate_per_s=rate,
        poisson=poisson,
        burstiness=burstiness or 1.0,
        workload=workload,
        seed=seed,
        temperature=temperature,
    )
    results = asyncio.run(run_sweep(config, lambda line: typer.echo(line, err=True)))
    _print_levels(results)
    if save_result is not None:
        _save_levels(save_result, config, results)
    if method is not None and gpu is not None:
        _store_levels(results, model, method, k, gpu, gpu_count)


def _checked_levels(
    concurrency: str, method: str | None, gpu: str | None, workload: str
) -> tuple[int, ...]:
    """The sweep's levels; exit 2 on options that do not go together."""
    from backends.workloads import WORKLOAD_NAMES

    try:
        levels = tuple(int(c) for c in concurrency.split(","))
    except ValueError:
        fail(f"--concurrency must be integers separated by commas, got {concurrency!r}")
    if (method is None) != (gpu is None):
        fail("--method and --gpu go together (they describe the measured server)")
    if workload not in WORKLOAD_NAMES:
        fail(f"unknown --workload {workload!r}; known: {', '.join(WORKLOAD_NAMES)}")
    return levels


def _level_length(
    requests: int | None, duration: float | None
) -> tuple[int | None, float | None, int | None]:
    """Each level's requests, else seconds, and requests per client at least (none given:
    50 per level, at least 8 per client)."""
    from backends.bench import DEFAULT_REQUESTS_PER_CLIENT, DEFAULT_REQUESTS_PER_LEVEL

    per_client = None
    if requests is None and duration is None:
        requests, per_client = DEFAULT_REQUESTS_PER_LEVEL, DEFAULT_REQUESTS_PER_CLIENT
    seconds = duration if requests is None else None
    return requests, seconds, per_client


def _check_arrivals(rate: float | None, poisson: bool, burstiness: float | None) -> None:
    if poisson and rate is None:
        fail("--poisson shapes the arrivals of an open-loop run: give --rate too")
    if burstiness is not None and not poisson:
        fail("--burstiness is the gamma shape of random arrivals: give --poisson too")


def _print_levels(results: list[Any]) -> None:
    typer.echo(
        f"{'c':>4} {'done':>5} {'fail':>4} {'req/s':>7} {'tok/s':>9} {'TTFT ms':>8} "
        f"{'TPOT ms':>7} {'ITL ms':>7} {'e2e ms':>8} {'AL':>5}"
    )
    for r in results:
        al = "-" if r.acceptance_length is None else f"{r.acceptance_length:.2f}"
        done_per_s = r.completed / r.duration_s if r.duration_s else 0.0
        rate = r.achieved_request_rate_per_s or done_per_s  # closed loop: sent as they finish
        typer.echo(
            f"{r.concurrency:>4} {r.completed:>5} {r.failed:>4} {rate:>7.2f} "
            f"{r.output_tokens_per_s:>9.0f} {_mean(r.ttft_ms):>8.1f} "
            f"{_mean(r.tpot_ms):>7.2f} {_mean(r.itl_ms):>7.2f} {_mean(r.e2e_ms):>8.0f} {al:>5}"
        )


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
    from gateway.cli.common import settings_from_env
    from gateway.control.benchmarks import level_measurement
    from gateway.control.windows import above_ceiling

    backend = {"model": model, "method": method, "k": k, "gpu_type": gpu, "gpu_count": count}
    margin = settings_from_env().measurement_ceiling_margin
    measured = [level_measurement(r, backend) for r in results if r.completed]
    kept = [m for m in measured if not above_ceiling(m, margin)]
    for m in measured:
        if m not in kept:
            typer.echo(f"not stored: concurrency {m.concurrency:g} is above what {count}x "
                       f"{gpu} can deliver for {model}", err=True)  # fmt: skip
    with session() as db:
        db.add_all(kept)
    typer.echo(f"stored {len(kept)} measurement(s)", err=True)


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

    _import(
        lambda f: [read_vllm_bench(f, model=model, concurrency=concurrency)],
        files,
        method,
        k,
        gpu,
        gpu_count,
    )


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
    _check_ceilings(points, k, gpu, gpu_count)
    with session() as db:
        db.add_all(
            Measurement(
                model=p.model,
                method=method,
                k=k,
                gpu_type=gpu,
                gpu_count=gpu_count,
                concurrency=p.concurrency,
                output_tokens_per_s=p.output_tokens_per_s,
                mean_acceptance_length=p.mean_acceptance_length,
                acceptance_per_position=p.acceptance_per_position,
                ttft_ms=p.ttft_ms,
                itl_ms=p.itl_ms,
                source="import",
                requests=p.requests,
                mean_prompt_tokens=p.mean_prompt_tokens,
                mean_output_tokens=p.mean_output_tokens,
            )
            for p in points
        )
    typer.echo(f"imported {len(points)} measurement(s)")


def _check_ceilings(points: list[Any], k: int, gpu: str, gpu_count: int) -> None:
    """Fail, importing nothing, when a point is faster than its hardware can be (a point
    without its acceptance may keep every drafted token: 1 + K per step)."""
    from gateway.cli.common import settings_from_env
    from planner.ceiling import ceiling_exceeded

    margin = settings_from_env().measurement_ceiling_margin
    if margin is None:
        return
    for p in points:
        rate = p.output_tokens_per_s
        per_step = p.mean_acceptance_length or 1 + k
        args = (p.model, gpu, gpu_count, p.concurrency, per_step, rate, margin)
        if (ceiling := ceiling_exceeded(*args)) is not None:
            fail(
                f"nothing imported: {rate:.0f} output tokens/s at concurrency "
                f"{p.concurrency:g} is above what {gpu_count}x {gpu} can deliver for {p.model} "
                f"({ceiling:.0f} at most, x{margin:g} allowed: "
                "DRAFTGATE_MEASUREMENT_CEILING_MARGIN)"
            )
