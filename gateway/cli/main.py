"""The `draftgate` command: the stack, the gateway alone, the database and API keys."""

from __future__ import annotations

import contextlib
import gc
import logging
import resource
import signal
import socket
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
import uvicorn

from gateway.cli.common import CLI_ACTOR, LOG_FORMAT, fail, session, settings_from_env
from gateway.cli.dev import dev_app
from gateway.cli.measure import bench, import_app
from gateway.cli.plan import plan_app
from gateway.settings import Settings

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from backends.launcher import LocalServer
    from gateway.app import GatewayApp
    from gateway.control.managed import Launch, ManagedBackends
    from gateway.server.replica import Replica

app = typer.Typer(help="draftgate: a cost-aware gateway for speculative-decoding vLLM fleets.")
db_app = typer.Typer(help="Database schema.")
keys_app = typer.Typer(help="Client API keys.")
app.add_typer(db_app, name="db")
app.add_typer(keys_app, name="keys")
app.add_typer(plan_app, name="plan")
app.add_typer(import_app, name="import")
app.add_typer(dev_app, name="dev")
app.command()(bench)

Port = Annotated[int, typer.Option(min=1, max=65535)]
# The dashboard's server: request heads as the gateway's defaults bound them (a browser
# sends a few KiB), and a client that reads nothing of an answer for 30 s is cut.
DASHBOARD_MAX_HEADER_BYTES = 65536
DASHBOARD_MAX_HEADERS = 100
DASHBOARD_WRITE_TIMEOUT_S = 30.0
OPEN_FILES_WITHOUT_HARD_LIMIT = 1_048_576  # what to ask for when the hard limit is unlimited


def _exit_zero(signum: int, frame: FrameType | None) -> NoReturn:
    raise SystemExit(0)


def _raise_open_files_limit() -> None:
    """Lift the soft limit on open files to the hard one: each stream holds two sockets (the
    client's, the backend's), and the usual soft limit of 1024 would cut a replica off near
    500 streams while the hard limit allows far more."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft >= hard:
        return
    wanted = hard if hard != resource.RLIM_INFINITY else max(soft, OPEN_FILES_WITHOUT_HARD_LIMIT)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    except (ValueError, OSError) as exc:
        logging.getLogger(__name__).warning("open-file limit stays %d: %s", soft, exc)
        return
    logging.getLogger(__name__).info("open-file limit raised from %d to %d", soft, wanted)


def _serve(
    settings: Settings, managed: ManagedBackends | None = None, log_file: Path | None = None
) -> None:
    from gateway.app import create_app
    from gateway.server.workers import run_workers

    # uvicorn shuts down gracefully on SIGTERM, then re-raises the signal to the previous
    # handler; without this one the process would die by the signal (exit 143) after a clean stop.
    signal.signal(signal.SIGTERM, _exit_zero)

    logging.basicConfig(level=settings.log_level.upper(), format=LOG_FORMAT)
    _raise_open_files_limit()
    if log_file is not None:  # beside the backends' logs; the terminal keeps its copy
        handler = logging.FileHandler(log_file, encoding="utf-8")
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        logging.getLogger().addHandler(handler)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per upstream request
    if settings.workers == 1 or managed is not None:  # managed backends live in this process
        _run_server(_server_config(settings, create_app(settings, managed)))
        return

    _prepare_database_once(settings)
    prepared = settings.model_copy(update={"migrate_on_start": False, "fleet": None})

    def serve_worker(sock: socket.socket, replica: Replica) -> None:
        signal.signal(signal.SIGTERM, _exit_zero)  # as above, in the worker
        _run_server(_server_config(prepared, create_app(prepared, replica=replica)), sock)

    run_workers(
        settings.workers, settings.host, settings.port, settings.worker_state_dir, serve_worker
    )


def _run_server(config: uvicorn.Config, sock: socket.socket | None = None) -> None:
    """Serve until stopped. uvicorn re-raises Ctrl-C once it has stopped gracefully; as
    `uvicorn.run` does, that is a clean exit."""
    with contextlib.suppress(KeyboardInterrupt):
        _Server(config).run(sockets=None if sock is None else [sock])


class _Server(uvicorn.Server):
    """uvicorn's server, freezing the heap once the app has started.

    What the process holds by then (modules, the app, its routes, schemas, engine and
    registry) lives as long as it does. Frozen out of the garbage collector's reach, a full
    collection walks only what serving made since: a pause of milliseconds, not the 80-140
    ms for which it stalled the event loop and every stream in flight (bench/README.md)."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        gc.collect()
        gc.freeze()


def _prepare_database_once(settings: Settings) -> None:
    """Migrate and apply the fleet file before the workers start, not once in each."""
    from gateway.app import prepare_database
    from gateway.db.session import make_engine

    engine = make_engine(settings.database_url)
    try:
        prepare_database(settings, engine)
    finally:
        engine.dispose()  # no connection crosses the fork


def _server_config(settings: Settings, app: GatewayApp) -> uvicorn.Config:
    """uvicorn's settings for a gateway process."""
    from gateway.server.http_limits import RequestLimits, protocol_with

    limits = RequestLimits(
        settings.max_header_bytes,
        settings.max_header_count,
        settings.request_read_timeout_s,
        settings.client_write_timeout_s,
    )
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=None,  # uvicorn's loggers propagate to the handlers set up above
        access_log=False,
        http=protocol_with(limits),
        timeout_keep_alive=settings.keep_alive_s,
        timeout_graceful_shutdown=settings.shutdown_grace_s,
    )


@app.command()
def gateway(
    host: Annotated[str | None, typer.Option(help="Interface to listen on.")] = None,
    port: Annotated[int | None, typer.Option(min=1, max=65535)] = None,
    workers: Annotated[
        int | None,
        typer.Option(min=1, max=64, help="Worker processes on the port (DRAFTGATE_WORKERS)."),
    ] = None,
) -> None:
    """Run the gateway alone (settings from DRAFTGATE_* and DRAFTGATE_FLEET)."""
    given = {"host": host, "port": port, "workers": workers}
    overrides = {k: v for k, v in given.items() if v is not None}
    settings = settings_from_env(**overrides)
    if settings.admin_token is None:
        fail("DRAFTGATE_ADMIN_TOKEN is not set; the admin API needs a token")
    _serve(settings)


@app.command()
def up(
    port: Port = 8080,
    dashboard_port: Port = 8501,
    sim_base_port: Port = 8101,
    time_scale: float = 1.0,
    demo_traffic: bool = False,
    dashboard: bool = True,
    real_vllm: Annotated[
        bool, typer.Option(help="Real vLLM servers for a tiny local model, not simulators.")
    ] = False,
    methods: Annotated[
        str, typer.Option(help="With --real-vllm: the methods to serve, comma-separated.")
    ] = "plain,ngram,p-eagle,dflash",
) -> None:
    """Run the stack locally on SQLite: simulated backends for a demo model and the gateway.

    With --real-vllm, `vllm serve` processes (DRAFTGATE_VLLM_PYTHON names vLLM's
    interpreter) serve a tiny model built locally, one per method, instead.
    """
    from backends.launcher import LaunchError
    from gateway.cli import stack
    from gateway.control.managed import ManagedBackends

    # One worker: the backends it starts and switches live in the gateway's process.
    settings = settings_from_env(port=port, require_api_key=False, workers=1)
    if settings.measurement_ceiling_margin is not None and not real_vllm:
        margin = settings.measurement_ceiling_margin * max(time_scale, 1.0)  # sped-up hardware
        settings = settings.model_copy(update={"measurement_ceiling_margin": margin})
    state_dir = Path(".draftgate")
    log_dir = state_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    token_file = None
    if settings.admin_token is None:
        token_file = state_dir / stack.ADMIN_TOKEN_FILE
        try:
            settings = settings.model_copy(
                update={"admin_token": stack.kept_admin_token(token_file)}
            )
        except stack.TokenFileError as exc:
            fail(str(exc))
    try:
        if real_vllm:
            servers, launch, demo_key = _start_real_vllm(
                settings, methods.split(","), sim_base_port, log_dir
            )
        else:
            demo_key = _prepare(settings, lambda db: stack.seed_demo(db, sim_base_port))
            servers = stack.start_simulators(sim_base_port, time_scale, log_dir)
            launch = stack.sim_launcher(time_scale)
    except (LaunchError, ValueError) as exc:
        fail(f"a backend did not start: {exc}")
    managed = ManagedBackends(launch, log_dir, servers)
    dashboards: list[LocalServer] = []
    traffic = threading.Event()  # set to stop the demo traffic
    try:
        if dashboard:
            dashboards.append(_start_dashboard(settings, dashboard_port, log_dir))
        where = _Banner(log_dir, token_file, real_vllm, demo_traffic)
        _print_banner(settings, servers + dashboards, where, demo_key)
        if demo_traffic:
            traffic = _start_demo_traffic(settings, _model(real_vllm), demo_key)
        _serve(settings, managed, log_dir / "gateway.log")
    except LaunchError as exc:
        fail(f"the dashboard did not start: {exc}")
    finally:
        traffic.set()
        stack.stop_all(dashboards + servers)


def _model(real_vllm: bool) -> str:
    from gateway.cli import stack

    return stack.REAL_VLLM_MODEL if real_vllm else stack.DEMO_MODEL


def _start_demo_traffic(settings: Settings, model: str, api_key: str) -> threading.Event:
    """A load that rises and falls, through this gateway (it waits for the gateway)."""
    from gateway.cli.demo_traffic import DemoLoad, start_in_thread

    base_url = f"http://{settings.host}:{settings.port}"
    _, stop = start_in_thread(base_url, DemoLoad(model), api_key)
    return stop


def _start_dashboard(settings: Settings, port: int, log_dir: Path) -> LocalServer:
    """The dashboard process of `draftgate up`, reading this gateway's admin API."""
    from gateway.cli import stack

    assert settings.admin_token is not None
    gateway_url = f"http://{settings.host}:{settings.port}"
    return stack.start_dashboard(port, gateway_url, settings.admin_token, log_dir)


def _start_real_vllm(
    settings: Settings, methods: list[str], base_port: int, log_dir: Path
) -> tuple[list[LocalServer], Launch, str]:
    from gateway.cli import real_vllm

    models = real_vllm.prepare(Path(".draftgate") / "models")
    backends = real_vllm.real_backends(methods, base_port, models)
    demo_key = _prepare(settings, lambda db: real_vllm.seed(db, backends))
    launch = real_vllm.vllm_launcher(settings.vllm_python, models.target)
    typer.echo(f"starting {len(backends)} vLLM server(s); this takes a minute or two", err=True)
    return real_vllm.start(backends, launch, log_dir), launch, demo_key


def _prepare(settings: Settings, seed: Callable[[Session], None]) -> str:
    """Migrate the database, register the stack's backends in it; a fresh demo API key."""
    from gateway.app import prepare_database
    from gateway.cli import stack
    from gateway.db.session import make_engine, make_sessionmaker, transaction

    engine = make_engine(settings.database_url)
    try:
        prepare_database(settings, engine)
        with transaction(make_sessionmaker(engine)) as db:
            seed(db)
            return stack.issue_demo_key(db)
    finally:
        engine.dispose()


@dataclass(frozen=True)
class _Banner:
    """What `up` started, for its banner."""

    log_dir: Path
    token_file: Path | None  # where the generated admin token is kept; None: it was set
    real_vllm: bool
    demo_traffic: bool


def _print_banner(
    settings: Settings, servers: list[LocalServer], where: _Banner, demo_key: str
) -> None:
    from gateway.urls import masked

    assert settings.admin_token is not None
    token = settings.admin_token.get_secret_value()
    base = f"http://{settings.host}:{settings.port}"
    real_vllm, log_dir = where.real_vllm, where.log_dir
    kind, model = ("vLLM" if real_vllm else "simulated vLLM"), _model(real_vllm)
    traffic = "on: 1 to 24 streaming clients, rising and falling every 2 minutes"
    traffic = traffic if where.demo_traffic else "off (--demo-traffic turns it on)"
    kept = "DRAFTGATE_ADMIN_TOKEN (as set)"
    if where.token_file:
        kept = f"{where.token_file} (mode 600; the next start reuses it)"
    sims = "\n".join(
        f"  {s.name:<13}{s.url}   ({kind if s.name != 'dashboard' else 'Streamlit'})"
        for s in servers
    )
    typer.echo(
        f"""
draftgate is starting
  gateway      {base}/v1   (OpenAI API; no API key needed in this demo)
  admin API    {base}/admin/v1   docs: {base}/docs
  metrics      {base}/metrics
{sims}
  database     {masked(settings.database_url)}
  logs         {log_dir}/   (gateway.log and one per backend)
  admin token  {token}
  token from   {kept}
  demo API key {demo_key}   (optional in this demo; --demo-traffic sends it)

  try: curl {base}/v1/chat/completions -H 'content-type: application/json' \\
         -d '{{"model": "{model}", "messages": [{{"role": "user", "content": "hi"}}]}}'
       curl -H 'Authorization: Bearer {token}' {base}/admin/v1/backends

  demo traffic {traffic}
Ctrl-C stops everything.
"""
    )
    sys.stdout.flush()


@db_app.command("upgrade")
def db_upgrade() -> None:
    """Apply every pending migration to DRAFTGATE_DATABASE_URL."""
    from gateway.db import migrate
    from gateway.db.session import make_engine

    engine = make_engine(settings_from_env().database_url)
    try:
        before = migrate.current_revision(engine)
        migrate.upgrade(engine)
        after = migrate.current_revision(engine)
    finally:
        engine.dispose()
    status = "already at" if before == after else f"upgraded from {before or 'empty'} to"
    typer.echo(f"database {status} revision {after}")


@keys_app.command("create")
def keys_create(
    name: str,
    requests_per_minute: Annotated[int | None, typer.Option(min=1)] = None,
    tokens_per_minute: Annotated[int | None, typer.Option(min=1)] = None,
    max_concurrent_requests: Annotated[
        int | None, typer.Option(min=1, help="Requests in flight at once, per replica.")
    ] = None,
    budget_usd: Annotated[float | None, typer.Option(min=0)] = None,
) -> None:
    """Create an API key and print it once."""
    from gateway.schemas.resources import KeyCreate
    from gateway.services.keys import create_key

    data = KeyCreate(
        name=name,
        requests_per_minute=requests_per_minute,
        tokens_per_minute=tokens_per_minute,
        max_concurrent_requests=max_concurrent_requests,
        budget_usd=budget_usd,
    )
    with session() as db:
        created = create_key(db, data, CLI_ACTOR)
    typer.echo(f"created key {created.id} ({created.name}); it is shown only this once:")
    typer.echo(created.key)


@keys_app.command("list")
def keys_list(include_revoked: bool = False) -> None:
    """List API keys (prefixes only; secrets are never stored)."""
    from gateway.db import queries

    with session() as db:
        rows = queries.list_keys(db, include_revoked)
        typer.echo(f"{'id':>5}  {'prefix':<12} {'name':<24} {'created':<20} revoked")
        for row in rows:
            created = row.created_at.strftime("%Y-%m-%d %H:%M:%S")
            revoked = row.revoked_at.strftime("%Y-%m-%d %H:%M:%S") if row.revoked_at else "-"
            typer.echo(f"{row.id:>5}  {row.key_prefix:<12} {row.name:<24} {created:<20} {revoked}")


@keys_app.command("revoke")
def keys_revoke(key_id: int) -> None:
    """Revoke an API key by id."""
    from gateway.errors import NotFound
    from gateway.services.keys import revoke_key

    try:
        with session() as db:
            row = revoke_key(db, key_id, CLI_ACTOR)
    except NotFound as exc:
        fail(exc.message, 1)
    typer.echo(f"revoked key {row.id} ({row.key_prefix}…, {row.name})")


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
    gpu_memory_utilization: Annotated[
        float, typer.Option(min=0.01, max=1.0, help="Share of GPU memory for weights + KV.")
    ] = 0.9,
    enable_prefix_caching: Annotated[
        bool, typer.Option(help="Cache prompt blocks and skip their prefill (vLLM's default).")
    ] = True,
    block_size: Annotated[int, typer.Option(min=1, help="Tokens per KV block.")] = 16,
    adaptive_verification: bool = False,
    per_request_spec_metrics: bool = False,
    enable_prompt_tokens_details: Annotated[
        bool,
        typer.Option(help="As vLLM's: usage says the prompt tokens found in the prefix cache."),
    ] = False,
    seed: int = 0,
    error_rate: Annotated[float, typer.Option(min=0, max=1)] = 0.0,
    stall_rate: Annotated[float, typer.Option(min=0, max=1)] = 0.0,
    drop_rate: Annotated[float, typer.Option(min=0, max=1)] = 0.0,
    crash_after_s: Annotated[float | None, typer.Option(min=0)] = None,
    startup_delay_s: Annotated[float, typer.Option(min=0)] = 0.0,
    delay_s: Annotated[
        float, typer.Option(min=0, help="Seconds every completion waits before answering.")
    ] = 0.0,
    api_key: Annotated[
        str | None,
        typer.Option(help="As vLLM's --api-key: required on /v1 routes."),
    ] = None,
) -> None:
    """Run one simulated vLLM server (vLLM's API and /metrics over a modelled engine)."""
    if ctx.invoked_subcommand is not None:
        return
    if model is None:
        fail("--model is required (e.g. --model openai/gpt-oss-20b)")
    from backends.sim.config import Faults, SimConfig
    from backends.sim.server import SimServer

    faults = Faults(error_rate, stall_rate, drop_rate, crash_after_s, startup_delay_s, delay_s)
    config = SimConfig(
        model=model,
        method=method,
        k=k,
        gpu=gpu,
        gpu_count=gpu_count,
        workload=workload,
        served_model_name=served_model_name,
        time_scale=time_scale,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        gpu_memory_utilization=gpu_memory_utilization,
        enable_prefix_caching=enable_prefix_caching,
        block_size=block_size,
        adaptive_verification=adaptive_verification,
        per_request_spec_metrics=per_request_spec_metrics,
        enable_prompt_tokens_details=enable_prompt_tokens_details,
        seed=seed,
        faults=faults,
        api_key=api_key,
    )
    try:
        server = SimServer(config)
    except (ValueError, KeyError) as exc:
        fail(str(exc))
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


@app.command("dashboard")
def dashboard_command(
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    port: Port = 8501,
    admin: Annotated[
        bool,
        typer.Option(
            "--admin",
            help="Act with DRAFTGATE_ADMIN_TOKEN, so the pages offer changes "
            "(DRAFTGATE_DASHBOARD_ADMIN). Put a login in front of it first.",
        ),
    ] = False,
) -> None:
    """Run the dashboard against DRAFTGATE_DASHBOARD_GATEWAY_URL, reading with
    DRAFTGATE_ADMIN_READ_TOKEN (or acting with DRAFTGATE_ADMIN_TOKEN under --admin)."""
    import os

    from dashboard.server import dashboard_app
    from dashboard.settings import DashboardSettings
    from gateway.server.http_limits import RequestLimits, protocol_with

    if admin:
        os.environ["DRAFTGATE_DASHBOARD_ADMIN"] = "true"  # the pages read their settings per run
    settings = DashboardSettings()
    limits = RequestLimits(
        DASHBOARD_MAX_HEADER_BYTES,
        DASHBOARD_MAX_HEADERS,
        settings.dashboard_read_timeout_s,
        DASHBOARD_WRITE_TIMEOUT_S,
    )
    signal.signal(signal.SIGTERM, _exit_zero)
    uvicorn.run(
        dashboard_app(settings.allowed_hosts),
        host=host,
        port=port,
        http=protocol_with(limits),
        ws="websockets-sansio",
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=5,
    )
