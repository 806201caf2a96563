"""`draftgate up`: the whole stack on one machine, with simulated backends for a demo model."""

from __future__ import annotations

import os
import secrets
import stat
import sys
from collections.abc import Callable
from pathlib import Path

from pydantic import SecretStr
from sqlalchemy.orm import Session

from backends.launcher import LocalServer, sim_argv
from backends.sim.config import DEFAULT_K
from gateway.control.managed import Launch
from gateway.db import queries
from gateway.db.sealed import new_key
from gateway.schemas.resources import BackendCreate, KeyCreate, PriceCreate
from gateway.server.private import open_private
from gateway.services.fleet import Fleet, apply_fleet
from gateway.services.keys import create_key, revoke_key
from gateway.services.prices import create_price
from planner.catalog import default_prices

DEMO_MODEL = "openai/gpt-oss-20b"
DEMO_GPU = "B200"
REAL_VLLM_MODEL = "tiny-llama"  # what `draftgate up --real-vllm` serves (gateway/cli/real_vllm.py)
# One simulated backend per method, with the published drafters for GPT-OSS-20B.
DEMO_METHODS: dict[str, str | None] = {
    "plain": None,
    "eagle3": "RedHatAI/gpt-oss-20b-speculator.eagle3",
    "p-eagle": "amazon/GPT-OSS-20B-P-EAGLE",
    "dflash": "z-lab/gpt-oss-20b-DFlash",
    "dspark": None,  # the simulator's DSpark head; vLLM would take it from the target
}
SIM_START_TIMEOUT_S = 30.0
ACTOR = "demo"
DEMO_KEY_NAME = "demo"
ADMIN_TOKEN_FILE = "admin-token"  # noqa: S105  (a file name under .draftgate/, not a token)
SECRETS_KEY_FILE = "secrets-key"  # the key sealing backend API keys (gateway/db/sealed.py)


class TokenFileError(ValueError):
    """The kept admin token cannot be used; the message says why."""


def kept_admin_token(path: Path) -> SecretStr:
    """The admin token kept at `path` (mode 600), made there on the first start, so a
    restart keeps the token a dashboard or script already holds."""
    _keep(path, lambda: secrets.token_urlsafe(32))
    return _read_token(path)


def kept_secrets_key(path: Path) -> Path:
    """A key sealing backend API keys kept at `path` (mode 600), made there on the first
    start: the database's sealed keys open again after a restart."""
    _keep(path, new_key)
    return path


def _keep(path: Path, make: Callable[[], str]) -> None:
    """Write `make()` to a new owner-only `path`; leave one that is there."""
    try:
        fd = open_private(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        return
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        file.write(make() + "\n")


def _read_token(path: Path) -> SecretStr:
    if stat.S_IMODE(path.stat().st_mode) & 0o077:
        raise TokenFileError(f"{path} is readable by others: chmod 600 it, or delete it")
    token = path.read_text(encoding="utf-8").strip()
    if len(token) < 32:
        raise TokenFileError(f"{path} holds no token: delete it for a new one")
    return SecretStr(token)


def demo_backends(base_port: int) -> list[BackendCreate]:
    """The demo model's backends: one simulator per method on consecutive ports."""
    return [
        BackendCreate.model_validate(
            {
                "name": f"demo-{method}",
                "url": f"http://127.0.0.1:{base_port + i}",
                "model": DEMO_MODEL,
                "method": method,
                "k": DEFAULT_K.get(method),
                "drafter": drafter,
                "gpu_type": DEMO_GPU,
                "managed": True,
            }
        )
        for i, (method, drafter) in enumerate(DEMO_METHODS.items())
    ]


def seed_demo(session: Session, base_port: int) -> None:
    """Register the demo backends, and default GPU prices where none are set."""
    apply_fleet(session, Fleet(backends=demo_backends(base_port)))
    for price in default_prices():
        if queries.find_price(session, price.gpu_type, price.kind) is None:
            data = PriceCreate(
                gpu_type=price.gpu_type,
                kind=price.kind,
                usd_per_gpu_hour=price.usd_per_gpu_hour,
                source=price.source,
                date=price.date,
            )
            create_price(session, data, ACTOR)


def issue_demo_key(session: Session) -> str:
    """A fresh API key named `demo` (the previous start's is revoked): `up` prints it and its
    demo traffic sends it, so per-key usage has an owner; keys stay optional in the demo."""
    for row in queries.list_keys(session):
        if row.name == DEMO_KEY_NAME:
            revoke_key(session, row.id, ACTOR)
    return create_key(session, KeyCreate(name=DEMO_KEY_NAME), ACTOR).key


def sim_launcher(time_scale: float) -> Launch:
    """How `draftgate up` starts a simulated backend (for switches of managed backends)."""

    def launch(backend: BackendCreate, port: int, log_path: Path) -> LocalServer:
        argv = sim_argv(
            backend.model, backend.method, port, gpu=backend.gpu_type, time_scale=time_scale
        )
        argv += ["--gpu-count", str(backend.gpu_count)]
        if backend.k is not None:
            argv += ["--k", str(backend.k)]
        argv += ["--scheduling-policy", backend.scheduling]
        return LocalServer(backend.name, argv, port, log_path)

    return launch


def start_simulators(base_port: int, time_scale: float, log_dir: Path) -> list[LocalServer]:
    """Start one simulator per demo method and wait until all are healthy."""
    servers = []
    for i, backend in enumerate(demo_backends(base_port)):
        argv = sim_argv(
            DEMO_MODEL, backend.method, base_port + i, gpu=DEMO_GPU, time_scale=time_scale
        )
        log_path = log_dir / f"{backend.name}.log"
        servers.append(LocalServer(backend.name, argv, base_port + i, log_path))
    try:
        for server in servers:
            server.start()
        for server in servers:
            server.wait_healthy(SIM_START_TIMEOUT_S)
    except BaseException:
        stop_all(servers)
        raise
    return servers


def stop_all(servers: list[LocalServer]) -> None:
    """Stop every server started here."""
    for server in servers:
        server.stop()


def start_dashboard(
    port: int, gateway_url: str, admin_token: SecretStr, log_dir: Path
) -> LocalServer:
    """Start `draftgate dashboard --admin` on 127.0.0.1:`port` against the gateway at
    `gateway_url`: the demo's dashboard drives the demo, on loopback only.

    The token travels in the environment, not the command line other users can read.
    """
    draftgate = Path(sys.executable).parent / "draftgate"
    env = {
        "DRAFTGATE_DASHBOARD_GATEWAY_URL": gateway_url,
        "DRAFTGATE_ADMIN_TOKEN": admin_token.get_secret_value(),
    }
    argv = [str(draftgate), "dashboard", "--port", str(port), "--admin"]
    server = LocalServer("dashboard", argv, port, log_dir / "dashboard.log", env=env)
    server.start()
    return server
