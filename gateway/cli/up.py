"""`draftgate up`: the stack on one machine (simulated or real vLLM backends, the gateway,
the dashboard, demo traffic)."""

from __future__ import annotations

import os
import socket
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gateway.cli.common import fail, settings_from_env
from gateway.cli.serve import Port, serve
from gateway.server.private import UnsafeDirectory, private_directory, read_private, try_lock
from gateway.settings import Settings

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from backends.launcher import LocalServer
    from gateway.control.managed import Launch

STATE_DIR = Path(".draftgate")
LOCK_FILE = "up.lock"  # held by the running stack; says where it serves


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

    settings = _settings(port, time_scale, real_vllm)
    # Before any state is touched: one stack per state directory, and every port free.
    backend_ports = range(sim_base_port, sim_base_port + len(_methods(real_vllm, methods)))
    ports = [(settings.host, settings.port)]
    ports += [("127.0.0.1", p) for p in [*([dashboard_port] if dashboard else []), *backend_ports]]
    claim = _claim(settings, ports)
    log_dir = STATE_DIR / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    settings, token_file = _with_kept_secrets(settings)
    try:
        if real_vllm:
            servers, launch, demo_key = _start_real_vllm(
                settings, _methods(real_vllm, methods), sim_base_port, log_dir
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
        serve(settings, managed, log_dir / "gateway.log")
    except LaunchError as exc:
        fail(f"the dashboard did not start: {exc}")
    finally:
        traffic.set()
        stack.stop_all(dashboards + servers)
        os.close(claim)


def _settings(port: int, time_scale: float, real_vllm: bool) -> Settings:
    """The environment's settings for `up`: one worker (the backends it starts and switches
    live in the gateway's process), API keys optional unless DRAFTGATE_REQUIRE_API_KEY says
    otherwise, and the ceiling check scaled to simulators run faster than real time."""
    require_key = os.environ.get("DRAFTGATE_REQUIRE_API_KEY") is not None
    overrides = {} if require_key else {"require_api_key": False}
    settings = settings_from_env(port=port, workers=1, **overrides)
    if settings.measurement_ceiling_margin is not None and not real_vllm:
        margin = settings.measurement_ceiling_margin * max(time_scale, 1.0)  # sped-up hardware
        settings = settings.model_copy(update={"measurement_ceiling_margin": margin})
    return settings


def _methods(real_vllm: bool, methods: str) -> list[str]:
    """The methods whose backends `up` starts, one port each."""
    from gateway.cli import stack

    return methods.split(",") if real_vllm else list(stack.DEMO_METHODS)


def _claim(settings: Settings, ports: list[tuple[str, int]]) -> int:
    """Hold the state directory for this stack's life (a lock the kernel drops when the
    process ends, however it ends); exit, having changed nothing, when another stack holds
    it or a port is taken."""
    try:
        private_directory(STATE_DIR)
    except UnsafeDirectory as exc:
        fail(str(exc))
    fd = try_lock(STATE_DIR / LOCK_FILE)
    if fd is None:
        running = read_private(STATE_DIR / LOCK_FILE).decode().strip() or "an unknown address"
        fail(
            f"already running at {running}: this directory's stack is up (stop it with Ctrl-C "
            "in its terminal, or run another from another directory with other ports)"
        )
    taken = [port for host, port in ports if not _free(host, port)]
    if taken:
        os.close(fd)
        fail(
            f"port {', '.join(map(str, taken))} in use by another program: choose others "
            "(make up PORT=... DASHBOARD_PORT=... SIM_BASE_PORT=...)"
        )
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"http://{settings.host}:{settings.port} (pid {os.getpid()})\n".encode(), 0)
    return fd


def _free(host: str, port: int) -> bool:
    """Whether `port` can be listened on (as the server will: address reuse on)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def _with_kept_secrets(settings: Settings) -> tuple[Settings, Path | None]:
    """The settings with a secrets key (`_with_secrets_key`) and an admin token: theirs,
    else one kept in the state directory (and the file it is kept in)."""
    from gateway.cli import stack

    settings = _with_secrets_key(settings)
    if settings.admin_token is not None:
        return settings, None
    token_file = STATE_DIR / stack.ADMIN_TOKEN_FILE
    try:
        settings = settings.model_copy(update={"admin_token": stack.kept_admin_token(token_file)})
    except stack.TokenFileError as exc:
        fail(str(exc))
    return settings, token_file


def _with_secrets_key(settings: Settings) -> Settings:
    """The settings with a key sealing backend API keys: theirs, else one kept in the state
    directory; in use from now on."""
    from gateway.cli import stack
    from gateway.db.sealed import use_keys

    if settings.secrets_key is None and settings.secrets_key_file is None:
        kept = stack.kept_secrets_key(STATE_DIR / stack.SECRETS_KEY_FILE)
        settings = settings.model_copy(update={"secrets_key_file": kept})
    use_keys(settings.secrets_keys())
    return settings


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

    models = real_vllm.prepare(STATE_DIR / "models")
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
    keys = "an API key is required" if settings.require_api_key else "no API key needed"
    demo_key_use = "required" if settings.require_api_key else "optional in this demo"
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
  gateway      {base}/v1   (OpenAI API; {keys})
  admin API    {base}/admin/v1   docs: {base}/docs
  metrics      {base}/metrics
{sims}
  database     {masked(settings.database_url)}
  logs         {log_dir}/   (gateway.log and one per backend)
  admin token  {token}
  token from   {kept}
  demo API key {demo_key}   ({demo_key_use}; --demo-traffic sends it)

  try: curl {base}/v1/chat/completions -H 'content-type: application/json' \\
         -d '{{"model": "{model}", "messages": [{{"role": "user", "content": "hi"}}]}}'
       curl -H 'Authorization: Bearer {token}' {base}/admin/v1/backends

  demo traffic {traffic}
Ctrl-C stops everything.
"""
    )
    sys.stdout.flush()
