"""The `draftgate` command: the stack, the gateway alone, the database and API keys."""

from __future__ import annotations

import logging
import secrets
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
import uvicorn
from pydantic import SecretStr, ValidationError

from gateway.settings import Settings

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from backends.launcher import LocalServer

app = typer.Typer(help="draftgate: a cost-aware gateway for speculative-decoding vLLM fleets.")
db_app = typer.Typer(help="Database schema.")
keys_app = typer.Typer(help="Client API keys.")
app.add_typer(db_app, name="db")
app.add_typer(keys_app, name="keys")

Port = Annotated[int, typer.Option(min=1, max=65535)]
CLI_ACTOR = "cli"
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
PASSTHROUGH = {"allow_extra_args": True, "ignore_unknown_options": True}


def _fail(message: str, code: int = 2) -> NoReturn:
    typer.echo(f"draftgate: {message}", err=True)
    raise typer.Exit(code)


def _settings(**overrides: object) -> Settings:
    """Settings from the environment, with command-line overrides; exit 2 when invalid."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        _fail("invalid settings: " + "; ".join(str(e["msg"]) for e in exc.errors()))


def _exit_zero(signum: int, frame: FrameType | None) -> NoReturn:
    raise SystemExit(0)


def _serve(settings: Settings) -> None:
    from gateway.app import create_app

    # uvicorn shuts down gracefully on SIGTERM, then re-raises the signal to the previous
    # handler; without this one the process would die by the signal (exit 143) after a clean stop.
    signal.signal(signal.SIGTERM, _exit_zero)

    logging.basicConfig(level=settings.log_level.upper(), format=LOG_FORMAT)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per upstream request
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=False,
    )


@app.command()
def gateway(
    host: Annotated[str | None, typer.Option(help="Interface to listen on.")] = None,
    port: Annotated[int | None, typer.Option(min=1, max=65535)] = None,
) -> None:
    """Run the gateway alone (settings from DRAFTGATE_* and DRAFTGATE_FLEET)."""
    overrides = {k: v for k, v in {"host": host, "port": port}.items() if v is not None}
    settings = _settings(**overrides)
    if settings.admin_token is None:
        _fail("DRAFTGATE_ADMIN_TOKEN is not set; the admin API needs a token")
    _serve(settings)


@app.command()
def up(
    port: Port = 8080,
    dashboard_port: Port = 8501,
    sim_base_port: Port = 8101,
    time_scale: float = 1.0,
    demo_traffic: bool = False,
    dashboard: bool = True,
) -> None:
    """Run the stack locally on SQLite: simulated backends for a demo model and the gateway."""
    from backends.launcher import LaunchError
    from gateway import stack

    settings = _settings(port=port, require_api_key=False)
    if settings.admin_token is None:
        token = secrets.token_urlsafe(32)
        settings = settings.model_copy(update={"admin_token": SecretStr(token)})
    _prepare(settings, sim_base_port)
    log_dir = Path(".draftgate") / "logs"
    try:
        simulators = stack.start_simulators(sim_base_port, time_scale, log_dir)
    except LaunchError as exc:
        _fail(f"a simulated backend did not start: {exc}")
    try:
        _print_banner(settings, simulators, log_dir)
        _serve(settings)
    finally:
        stack.stop_all(simulators)


def _prepare(settings: Settings, sim_base_port: int) -> None:
    from gateway import stack
    from gateway.app import prepare_database
    from gateway.db.session import make_engine, make_sessionmaker, transaction

    engine = make_engine(settings.database_url)
    try:
        prepare_database(settings, engine)
        with transaction(make_sessionmaker(engine)) as session:
            stack.seed_demo(session, sim_base_port)
    finally:
        engine.dispose()


def _print_banner(settings: Settings, simulators: list[LocalServer], log_dir: Path) -> None:
    assert settings.admin_token is not None
    token = settings.admin_token.get_secret_value()
    base = f"http://{settings.host}:{settings.port}"
    sims = "\n".join(f"  {s.name:<13}{s.url}   (simulated vLLM)" for s in simulators)
    typer.echo(
        f"""
draftgate is starting
  gateway      {base}/v1   (OpenAI API; no API key needed in this demo)
  admin API    {base}/admin/v1   docs: {base}/docs
  metrics      {base}/metrics
{sims}
  database     {settings.database_url}
  logs         {log_dir}/
  admin token  {token}

  try: curl {base}/v1/chat/completions -H 'content-type: application/json' \\
         -d '{{"model": "openai/gpt-oss-20b", "messages": [{{"role": "user", "content": "hi"}}]}}'
       curl -H 'Authorization: Bearer {token}' {base}/admin/v1/backends

  not started yet: collector, dashboard, demo traffic (their issues are open)
Ctrl-C stops everything.
"""
    )
    sys.stdout.flush()


@db_app.command("upgrade")
def db_upgrade() -> None:
    """Apply every pending migration to DRAFTGATE_DATABASE_URL."""
    from gateway.db import migrate
    from gateway.db.session import make_engine

    engine = make_engine(_settings().database_url)
    try:
        before = migrate.current_revision(engine)
        migrate.upgrade(engine)
        after = migrate.current_revision(engine)
    finally:
        engine.dispose()
    status = "already at" if before == after else f"upgraded from {before or 'empty'} to"
    typer.echo(f"database {status} revision {after}")


@contextmanager
def _session() -> Iterator[Session]:
    """A transaction on the migrated database of the current settings."""
    from gateway.db import migrate
    from gateway.db.session import make_engine, make_sessionmaker, transaction

    engine = make_engine(_settings().database_url)
    try:
        migrate.upgrade(engine)
        with transaction(make_sessionmaker(engine)) as session:
            yield session
    finally:
        engine.dispose()


@keys_app.command("create")
def keys_create(
    name: str,
    requests_per_minute: Annotated[int | None, typer.Option(min=1)] = None,
    tokens_per_minute: Annotated[int | None, typer.Option(min=1)] = None,
    budget_usd: Annotated[float | None, typer.Option(min=0)] = None,
) -> None:
    """Create an API key and print it once."""
    from gateway.admin.keys import create_key
    from gateway.admin.schemas import KeyCreate

    data = KeyCreate(
        name=name,
        requests_per_minute=requests_per_minute,
        tokens_per_minute=tokens_per_minute,
        budget_usd=budget_usd,
    )
    with _session() as session:
        created = create_key(session, data, CLI_ACTOR)
    typer.echo(f"created key {created.id} ({created.name}); it is shown only this once:")
    typer.echo(created.key)


@keys_app.command("list")
def keys_list(include_revoked: bool = False) -> None:
    """List API keys (prefixes only; secrets are never stored)."""
    from gateway.db import queries

    with _session() as session:
        rows = queries.list_keys(session, include_revoked)
        typer.echo(f"{'id':>5}  {'prefix':<12} {'name':<24} {'created':<20} revoked")
        for row in rows:
            created = row.created_at.strftime("%Y-%m-%d %H:%M:%S")
            revoked = row.revoked_at.strftime("%Y-%m-%d %H:%M:%S") if row.revoked_at else "-"
            typer.echo(f"{row.id:>5}  {row.key_prefix:<12} {row.name:<24} {created:<20} {revoked}")


@keys_app.command("revoke")
def keys_revoke(key_id: int) -> None:
    """Revoke an API key by id."""
    from gateway.admin.keys import revoke_key
    from gateway.errors import NotFound

    try:
        with _session() as session:
            row = revoke_key(session, key_id, CLI_ACTOR)
    except NotFound as exc:
        _fail(exc.message, 1)
    typer.echo(f"revoked key {row.id} ({row.key_prefix}…, {row.name})")


def _not_yet(command: str, issue: str) -> NoReturn:
    _fail(f"`draftgate {command}` is not implemented yet; it arrives with {issue}")


sim_app = typer.Typer(help="Simulated vLLM servers.", invoke_without_command=True)
app.add_typer(sim_app, name="sim")


@sim_app.callback()
def sim(
    ctx: typer.Context,
    model: Annotated[str | None, typer.Option(help="Catalog model to simulate.")] = None,
    method: Annotated[
        str, typer.Option(help="plain, eagle3, p-eagle, dflash, dspark, ...")
    ] = "plain",
    k: Annotated[int | None, typer.Option(help="Speculative tokens (default per method).")] = None,
    gpu: str = "B200",
    gpu_count: Annotated[int, typer.Option(min=1)] = 1,
    port: Port = 8101,
    host: str = "127.0.0.1",
    served_model_name: str | None = None,
    workload: Annotated[
        str, typer.Option(help="Acceptance profile: code, chat, mixed, math.")
    ] = "chat",
    time_scale: Annotated[float, typer.Option(help="Run simulated time X times as fast.")] = 1.0,
    max_num_seqs: Annotated[int, typer.Option(min=1)] = 256,
    max_model_len: Annotated[int | None, typer.Option(min=16)] = None,
    adaptive_verification: bool = False,
    per_request_spec_metrics: bool = False,
    seed: int = 0,
    error_rate: Annotated[float, typer.Option(min=0, max=1)] = 0.0,
    stall_rate: Annotated[float, typer.Option(min=0, max=1)] = 0.0,
    drop_rate: Annotated[float, typer.Option(min=0, max=1)] = 0.0,
    crash_after_s: Annotated[float | None, typer.Option(min=0)] = None,
    startup_delay_s: Annotated[float, typer.Option(min=0)] = 0.0,
) -> None:
    """Run one simulated vLLM server (vLLM's API and /metrics over a modelled engine)."""
    if ctx.invoked_subcommand is not None:
        return
    if model is None:
        _fail("--model is required (e.g. --model openai/gpt-oss-20b)")
    from backends.sim.config import Faults, SimConfig
    from backends.sim.server import SimServer

    faults = Faults(error_rate, stall_rate, drop_rate, crash_after_s, startup_delay_s)
    config = SimConfig(
        model=model, method=method, k=k, gpu=gpu, gpu_count=gpu_count, workload=workload,
        served_model_name=served_model_name, time_scale=time_scale, max_num_seqs=max_num_seqs,
        max_model_len=max_model_len, adaptive_verification=adaptive_verification,
        per_request_spec_metrics=per_request_spec_metrics, seed=seed, faults=faults,
    )  # fmt: skip
    try:
        server = SimServer(config)
    except (ValueError, KeyError) as exc:
        _fail(str(exc))
    logging.basicConfig(level="INFO", format=LOG_FORMAT)
    signal.signal(signal.SIGTERM, _exit_zero)
    uvicorn.run(server, host=host, port=port, log_level="warning", access_log=False)


@sim_app.command("calibrate")
def sim_calibrate(
    steps: Annotated[int, typer.Option(min=100, help="Engine steps per measured point.")] = 3000,
) -> None:
    """Print every published figure beside the simulator's; exit 1 if one misses its bar."""
    from backends.sim.calibrate import report

    lines, ok = report(steps)
    typer.echo("\n".join(lines))
    typer.echo("every calibrated figure is within its bar" if ok else "some figures miss their bar")
    raise typer.Exit(0 if ok else 1)


@app.command(context_settings=PASSTHROUGH)
def bench() -> None:
    """A load sweep against a backend (not implemented yet)."""
    _not_yet("bench", "the measure-and-act issue")


import_app = typer.Typer(help="Benchmark results from other tools, as measurements.")
app.add_typer(import_app, name="import")


@import_app.command("vllm-bench")
def import_vllm_bench(
    files: Annotated[list[Path], typer.Argument(help="`vllm bench serve --save-result` JSON.")],
    method: Annotated[str, typer.Option(help="The method the server ran.")],
    gpu: Annotated[str, typer.Option(help="GPU type the server ran on.")],
    k: Annotated[int, typer.Option(min=0, help="Speculative tokens (0 for plain).")] = 0,
    gpu_count: Annotated[int, typer.Option(min=1)] = 1,
    model: Annotated[str | None, typer.Option(help="When the file has no model_id.")] = None,
    concurrency: Annotated[float | None, typer.Option(help="When the file has none.")] = None,
) -> None:
    """Import result files as measurements (source import); all or nothing."""
    from backends.importers import ImportRejected, read_vllm_bench
    from backends.methods import METHODS
    from gateway.db.tables import Measurement

    if method not in METHODS:
        _fail(f"unknown method {method!r}; known: {', '.join(METHODS)}")
    try:
        points = [read_vllm_bench(f, model=model, concurrency=concurrency) for f in files]
    except ImportRejected as exc:
        _fail(f"nothing imported: {exc}")
    with _session() as session:
        session.add_all(
            Measurement(model=p.model, method=method, k=k, gpu_type=gpu, gpu_count=gpu_count,
                        concurrency=p.concurrency, output_tokens_per_s=p.output_tokens_per_s,
                        mean_acceptance_length=p.mean_acceptance_length,
                        acceptance_per_position=p.acceptance_per_position, ttft_ms=p.ttft_ms,
                        itl_ms=p.itl_ms, source="import")
            for p in points
        )  # fmt: skip
    typer.echo(f"imported {len(points)} measurement(s)")


plan_app = typer.Typer(help="The planner: predictions, tables and recommendations.")
app.add_typer(plan_app, name="plan")


@plan_app.command("table")
def plan_table(
    model: Annotated[str, typer.Option(help="Catalog model.")],
    gpu: str = "B200",
    gpu_count: Annotated[int, typer.Option(min=1)] = 1,
    workload: str = "chat",
    price: Annotated[float | None, typer.Option(help="USD per GPU-hour.")] = None,
) -> None:
    """Methods x concurrency: tok/s, ITL and $/1M at each method's best K (* = measured).

    Predictions are fitted to the measurements stored in DRAFTGATE_DATABASE_URL, if any.
    """
    from gateway.admin.plan import measured_grid
    from planner import catalog

    try:
        spec, hardware = catalog.model(model), catalog.gpu(gpu)
        usd = price or catalog.default_price(hardware.name).usd_per_gpu_hour
    except (catalog.UnknownCatalogEntry, KeyError) as exc:
        _fail(str(exc).strip("'\""))
    with _session() as session:
        points, measured, fitted = measured_grid(session, spec, hardware, gpu_count, workload, usd)
    best: dict[tuple[str, int], Any] = {}
    for p in points:
        key = (p.method, p.concurrency)
        if key not in best or p.output_tokens_per_s > best[key].output_tokens_per_s:
            best[key] = p
    band = "" if fitted.error_band is None else f", fit error +-{fitted.error_band:.0%}"
    typer.echo(f"{spec.name} on {gpu_count}x {hardware.name} at ${usd:.2f}/GPU-hour, {workload} "
               f"traffic; {fitted.points} measurements{band}; K = best per cell")  # fmt: skip
    typer.echo(f"{'method':<8} {'c':>4} {'K':>2} {'tok/s':>10} {'ITL ms':>8} {'$/1M':>8}")
    for (method, c), p in sorted(best.items()):
        seen = measured.get((p.method, p.k, float(c)))
        tps = f"{seen * gpu_count:.0f}*" if seen is not None else f"{p.output_tokens_per_s:.0f} "
        typer.echo(f"{method:<8} {c:>4} {p.k:>2} {tps:>10} {p.itl_ms:>8.2f} {p.usd_per_mtok:>8.3f}")


@plan_app.command("recommend")
def plan_recommend(
    model: Annotated[str, typer.Option(help="Catalog model.")],
    gpu: str = "B200",
    gpu_count: Annotated[int, typer.Option(min=1)] = 1,
    workload: str = "chat",
    itl_objective_ms: Annotated[float | None, typer.Option(min=0)] = None,
    price: Annotated[float | None, typer.Option(help="USD per GPU-hour.")] = None,
) -> None:
    """The best method and K per concurrency, crossovers, and vLLM's K schedule."""
    from planner.recommend import best_per_concurrency, cliffs, crossovers, grid, k_schedule

    points = _plan_grid(grid, model, gpu, gpu_count, workload, price)
    choices = best_per_concurrency(points, itl_objective_ms)
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


def _plan_grid(
    grid: Any, model: str, gpu: str, count: int, workload: str, price: float | None
) -> Any:
    from planner.catalog import UnknownCatalogEntry

    try:
        return grid(model, gpu, gpu_count=count, workload=workload, price_usd_per_gpu_hour=price)
    except (UnknownCatalogEntry, KeyError) as exc:
        _fail(str(exc).strip("'\""))


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
        _fail(f"cannot read scenario {input_path}: {exc}")
    if not isinstance(raw, dict):
        _fail("the scenario must be a JSON object")
    try:
        predictions = predict(parse_scenario(raw))
    except PlanError as exc:
        _fail(str(exc))
    typer.echo(json.dumps(predictions_json(predictions), indent=2))
