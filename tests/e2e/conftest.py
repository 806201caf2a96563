"""End-to-end helpers: the real `draftgate` console script as a subprocess on a free port."""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine, text

from tests.conftest import DATABASES, new_postgres_schema

DRAFTGATE = Path(sys.executable).parent / "draftgate"
ADMIN_TOKEN = "e2e-admin-token-0123456789abcdef"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
T = TypeVar("T")
READ_TOKEN = "e2e-read-token-0123456789abcdef"
HEALTH_TIMEOUT_S = 60.0  # a deadline, not a wait: a busy 2-core machine starts slowly
EXIT_TIMEOUT_S = 10.0
CLI_TIMEOUT_S = 60.0
POLL_INTERVAL_S = 0.05


# Ports handed out in this session: a port is never handed out twice, so two servers of one
# test (or a server and a "closed" URL) cannot be given the same port before either binds.
_issued_ports: set[int] = set()


def _ephemeral_port_floor() -> int:
    """The lowest port the kernel gives outgoing connections (their source ports)."""
    try:
        low = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0]
    except (OSError, IndexError):
        return 32_768
    return int(low)


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, not handed out before."""
    for _ in range(200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
        if port not in _issued_ports:
            _issued_ports.add(port)
            return port
    raise RuntimeError("no free port found that was not handed out before")


def free_port_block(count: int) -> int:
    """The first of `count` consecutive ports on 127.0.0.1 that nothing listens on now.

    The block lies below the kernel's ephemeral range when there is room, so no outgoing
    connection takes one of its ports as a source port before the servers bind them.
    """
    low, high = 20_000, _ephemeral_port_floor() - count
    if high - low < 1_000:
        low, high = 20_000, 60_000 - count
    for _ in range(200):
        base = random.randint(low, high)
        ports = range(base, base + count)
        if _issued_ports.isdisjoint(ports) and all(_bindable(port) for port in ports):
            _issued_ports.update(ports)
            return base
    raise RuntimeError(f"no block of {count} free ports found")


def draftgate_env(**variables: str) -> dict[str, str]:
    """This process's environment without any DRAFTGATE_* variable, plus `variables`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRAFTGATE_")}
    env.update(variables)
    return env


def sqlalchemy_url(database_url: str) -> str:
    """The URL the gateway's settings would use (psycopg 3 for PostgreSQL)."""
    return re.sub(r"^postgres(ql)?://", "postgresql+psycopg://", database_url)


CliRunner = Callable[..., "subprocess.CompletedProcess[str]"]


@pytest.fixture(scope="module", params=DATABASES)
def module_database(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A database for one module's stack: a SQLite file, or a fresh schema of the real
    PostgreSQL (dropped afterwards)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path_factory.mktemp('module-db')}/draftgate.db"
        return
    with new_postgres_schema() as url:
        yield url


@pytest.fixture
def run_cli(tmp_path: Path) -> CliRunner:
    """Run `draftgate ARGS...` to completion with an explicit environment, in tmp_path."""

    def run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(DRAFTGATE), *args],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            encoding="utf-8",
            timeout=CLI_TIMEOUT_S,
            check=False,
        )

    return run


@dataclass
class Server:
    """A running `draftgate` process listening on `port`; its output goes to `log_path`."""

    process: subprocess.Popen[bytes]
    port: int
    log_path: Path
    log_file: IO[bytes] = field(repr=False)

    @property
    def base_url(self) -> str:
        """Where the process listens."""
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        """Everything the process wrote so far (stdout and stderr)."""
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def client(self, token: str | None = None) -> httpx.Client:
        """An HTTP client for this server, carrying `token` as the bearer when given."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=10.0)

    def _fail_if_exited(self, waiting_for: str) -> None:
        code = self.process.poll()
        if code is not None:
            pytest.fail(f"draftgate exited with {code} before {waiting_for}:\n{self.output()}")

    def wait_healthy(self, timeout_s: float = HEALTH_TIMEOUT_S) -> None:
        """Poll GET /health until it answers 200; fail with the output if the process dies."""
        deadline = time.monotonic() + timeout_s
        with httpx.Client(base_url=self.base_url, timeout=1.0) as http:
            while time.monotonic() < deadline:
                self._fail_if_exited("answering /health")
                try:
                    if http.get("/health").status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                time.sleep(POLL_INTERVAL_S)
        pytest.fail(f"/health did not answer within {timeout_s} s:\n{self.output()}")

    def wait_for_output(self, pattern: str, timeout_s: float = HEALTH_TIMEOUT_S) -> re.Match[str]:
        """Wait until the output matches `pattern` (a regex); the match."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            match = re.search(pattern, self.output(), re.MULTILINE)
            if match:
                return match
            self._fail_if_exited(f"printing {pattern!r}")
            time.sleep(POLL_INTERVAL_S)
        pytest.fail(f"no output matching {pattern!r} within {timeout_s} s:\n{self.output()}")

    def stop(self, sig: signal.Signals, timeout_s: float = EXIT_TIMEOUT_S) -> int:
        """Send `sig` and wait for the process to exit; its exit code."""
        self.process.send_signal(sig)
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pytest.fail(f"draftgate did not exit within {timeout_s} s of {sig.name}")

    def close(self) -> None:
        """Terminate the process if it still runs (kill it if it will not exit)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=EXIT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log_file.close()


ServerStarter = Callable[..., Server]


def spawn_server(
    args: tuple[str, ...], env: dict[str, str], log_dir: Path, port: int | None = None
) -> Server:
    """Start `draftgate ARGS... --port P` without waiting for it: on `port` (a restart on a
    known port), else a free one; each start logs to a file of its own."""
    port = port or free_port()
    log_path = log_dir / f"draftgate-{port}-{uuid.uuid4().hex[:6]}.log"
    log_file = log_path.open("wb")
    process = subprocess.Popen(
        [str(DRAFTGATE), *args, "--port", str(port)],
        env=env,
        cwd=log_dir,
        stdin=subprocess.DEVNULL,
        stdout=log_file,
        stderr=subprocess.STDOUT,
    )
    return Server(process=process, port=port, log_path=log_path, log_file=log_file)


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[ServerStarter]:
    """Start `draftgate ARGS... --port P` on a free port and wait until /health answers.

    Every process started is terminated in teardown, whatever the test did.
    """
    servers: list[Server] = []

    def start(*args: str, env: dict[str, str], wait: bool = True) -> Server:
        server = spawn_server(args, env, tmp_path)
        servers.append(server)
        if wait:
            server.wait_healthy()
        return server

    try:
        yield start
    finally:
        for server in servers:
            server.close()


# --- Simulated vLLM servers (`draftgate sim`), shared by a whole test module. ---

SIM_MODEL = "openai/gpt-oss-20b"


def sim_args(*options: str, model: str = SIM_MODEL) -> tuple[str, ...]:
    """`draftgate sim` arguments for `model` plus `options` (the port is added on start)."""
    return ("sim", "--model", model, *options)


ModuleServerStarter = Callable[..., list[Server]]


@pytest.fixture(scope="module")
def start_module_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleServerStarter]:
    """Start several `draftgate` processes at once (each `args` a tuple), wait for /health.

    They live for the whole module; every process is terminated in its teardown.
    """
    servers: list[Server] = []
    log_dir = tmp_path_factory.mktemp("servers")

    def start(*each_args: tuple[str, ...]) -> list[Server]:
        started = [spawn_server(args, draftgate_env(), log_dir) for args in each_args]
        servers.extend(started)
        for server in started:
            server.wait_healthy()
        return started

    try:
        yield start
    finally:
        for server in servers:
            server.close()


# --- The gateway (`draftgate gateway`) in front of simulators, declared by a fleet file. ---

GATEWAY_SETTINGS = {
    "REQUIRE_API_KEY": "false",
    "PROBE_INTERVAL_S": "0.5",
    "LEDGER_FLUSH_INTERVAL_S": "0.2",
    # The simulators of these tests run up to 100 times as fast as the B200s they claim
    # (`--time-scale`): 2 (the default) times that above the hardware's ceiling. A test of
    # the ceiling itself sets it back to 2.
    "MEASUREMENT_CEILING_MARGIN": "200",
    # The moves these tests make (a load up, a load down, within seconds) are the moving
    # average's: the load window (300 s by default) holds a choice for minutes. Its own
    # tests set it (tests/api/test_selector.py -k window, bench/regret.py).
    "SELECTOR_LOAD_WINDOW_S": "0",
}
LEDGER_TIMEOUT_S = 10.0
FleetEntry = Mapping[str, object]


def closed_url() -> str:
    """A base URL where nothing listens (a backend that is down)."""
    return f"http://127.0.0.1:{free_port()}"


def fleet_backend(
    name: str, url: str, method: str = "plain", *, model: str = SIM_MODEL, **fields: object
) -> dict[str, object]:
    """One `backends:` entry of a fleet file (p-eagle gets K=7 and its drafter by default)."""
    entry: dict[str, object] = {"name": name, "url": url, "model": model, "method": method}
    if method == "p-eagle":
        entry |= {"k": 7, "drafter": "amazon/GPT-OSS-20B-P-EAGLE"}
    return entry | fields


def write_fleet(
    path: Path, backends: Sequence[FleetEntry], models: Sequence[FleetEntry] = ()
) -> Path:
    """Write a fleet file declaring `backends` (and `models` with policies) at `path`."""
    document = {"backends": list(backends), "models": list(models)}
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


def gateway_env(database_url: str, fleet: Path, **settings: str) -> dict[str, str]:
    """The environment of a test gateway: fast probes and ledger, no API keys unless set.

    `settings` are DRAFTGATE_* names without the prefix, e.g. `MAX_BODY_BYTES="2048"`.
    """
    variables = {
        "DRAFTGATE_ADMIN_TOKEN": ADMIN_TOKEN,
        "DRAFTGATE_DATABASE_URL": database_url,
        "DRAFTGATE_FLEET": str(fleet),
    }
    variables |= {f"DRAFTGATE_{k}": v for k, v in (GATEWAY_SETTINGS | settings).items()}
    return draftgate_env(**variables)


ModuleGatewayStarter = Callable[..., tuple[Server, str]]


@pytest.fixture(scope="module")
def start_module_gateway(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ModuleGatewayStarter]:
    """Start `draftgate gateway` for a whole module on a fresh SQLite file; (server, db URL).

    Called with the fleet's backends (and optionally `models=`) plus DRAFTGATE_* overrides.
    """
    servers: list[Server] = []

    def start(
        backends: Sequence[FleetEntry],
        models: Sequence[FleetEntry] = (),
        **settings: str,
    ) -> tuple[Server, str]:
        log_dir = tmp_path_factory.mktemp("gateway")
        database_url = f"sqlite:///{log_dir}/draftgate.db"
        fleet = write_fleet(log_dir / "fleet.yaml", backends, models)
        server = spawn_server(("gateway",), gateway_env(database_url, fleet, **settings), log_dir)
        servers.append(server)
        server.wait_healthy()
        return server, database_url

    try:
        yield start
    finally:
        for server in servers:
            server.close()


def metric_value(base_url: str, name: str, **labels: str) -> float:
    """The sum of the samples called `name` in GET /metrics that carry `labels`."""
    text = httpx.get(f"{base_url}/metrics", timeout=5.0).text
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    return sum(s.value for s in samples if s.name == name and labels.items() <= s.labels.items())


def wait_for_metric(
    base_url: str, name: str, value: float, timeout_s: float = 5.0, **labels: str
) -> None:
    """Poll GET /metrics until `name` (summed over `labels`) equals `value`."""
    deadline = time.monotonic() + timeout_s
    while (seen := metric_value(base_url, name, **labels)) != value:
        if time.monotonic() > deadline:
            pytest.fail(f"{name}{labels} is {seen}, not {value}, after {timeout_s} s")
        time.sleep(POLL_INTERVAL_S)


def until(condition: Callable[[], T], what: str, timeout_s: float = 60.0) -> T:
    """Poll `condition` until it returns something true, and return that; fail naming `what`
    after `timeout_s` (a deadline for a busy machine, not a wait)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = condition()
        if found:
            return found
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout_s} s")
        time.sleep(POLL_INTERVAL_S * 4)


def price_gpu(gateway: Server, methods: Collection[str], usd_per_gpu_hour: float = 6.0) -> None:
    """Price B200s on the gateway and wait until the curves of `methods` are priced."""
    price = {"gpu_type": "B200", "usd_per_gpu_hour": usd_per_gpu_hour, "source": "test",
             "date": "2026-11-01"}  # fmt: skip
    created = httpx.post(f"{gateway.base_url}/admin/v1/prices", json=price, headers=ADMIN)
    assert created.status_code == 201, created.text

    def priced() -> bool:
        curves = httpx.get(
            f"{gateway.base_url}/admin/v1/curves", params={"model": SIM_MODEL}, headers=ADMIN
        ).json()["curves"]
        found = {c["method"] for c in curves if all(p["usd_per_mtok"] for p in c["line"])}
        return set(methods) <= found

    until(priced, f"priced curves of {', '.join(methods)}")


def query_rows(database_url: str, sql: str, **params: object) -> list[dict[str, Any]]:
    """Rows of one SQL query on the gateway's database, as dicts."""
    engine = create_engine(sqlalchemy_url(database_url))
    try:
        with engine.connect() as conn:
            return [dict(row._mapping) for row in conn.execute(text(sql), params)]
    finally:
        engine.dispose()


def wait_for_usage_records(
    database_url: str, request_ids: Collection[str], timeout_s: float = LEDGER_TIMEOUT_S
) -> dict[str, dict[str, Any]]:
    """Poll `usage_records` until a record of every x-request-id is written; them by that id."""
    wanted, deadline = set(request_ids), time.monotonic() + timeout_s
    while True:
        rows = query_rows(database_url, "SELECT * FROM usage_records")
        found = {r["client_request_id"]: r for r in rows if r["client_request_id"] in wanted}
        if len(found) == len(wanted):
            return found
        if time.monotonic() > deadline:
            pytest.fail(f"ledger holds {len(found)} of {len(wanted)} records after {timeout_s} s")
        time.sleep(POLL_INTERVAL_S)
