"""The compose file's `sim` profile run as local processes on loopback: what `docker compose
--profile sim up` would start, without a Docker engine; and its two dashboards, the published
read-only one and the `login` profile's admin one (oauth2-proxy, which guards it, is an image
of its own and does not run here: test_compose.py checks its configuration).

Each process is started from its service's `command` and `environment` in
docker-compose.yml; only what Docker's network provides is swapped for the local
equivalent: 127.0.0.1 and free ports instead of service names and fixed ports, the test's
PostgreSQL schema instead of the `postgres` service, and the profile's fleet file with its
URLs pointed at the local simulators (the `./deploy/compose:/etc/draftgate` mount).
"""

from __future__ import annotations

import os
import re
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import openai
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from dashboard.client import AdminApiError, AdminClient, admin_client
from dashboard.settings import DashboardSettings
from tests.e2e.conftest import (
    ADMIN_TOKEN,
    READ_TOKEN,
    CliRunner,
    Server,
    ServerStarter,
    draftgate_env,
    query_rows,
    wait_for_usage_records,
)
from tests.e2e.test_compose import COMPOSE, grafana_metric_names, parse_draftgate, services_in

pytestmark = pytest.mark.postgres
READY_TIMEOUT_S = 90.0  # two gateways and five simulators on a busy machine
REQUEST_TIMEOUT_S = 60.0
VARIABLE = re.compile(r"\$\{(\w+)(?::([-?])([^}]*))?\}")
# What the compose file's header has you export; nothing of the login profile's.
VARIABLES = {"DRAFTGATE_ADMIN_TOKEN": ADMIN_TOKEN, "DRAFTGATE_ADMIN_READ_TOKEN": READ_TOKEN}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    return loaded


def interpolate(value: str, variables: dict[str, str]) -> str:
    """Compose's `${VAR}`, `${VAR:-default}` and `${VAR:?error}` substitution."""

    def substitute(match: re.Match[str]) -> str:
        name, kind, rest = match[1], match[2], match[3]
        if variables.get(name):
            return variables[name]
        if kind == "?":
            pytest.fail(f"compose would refuse to start: {name} unset ({rest})")
        return rest if kind == "-" else ""

    return VARIABLE.sub(substitute, value)


def local_args(command: list[str]) -> tuple[str, ...]:
    """A service's `draftgate` command on loopback, without `--port` (the fixture adds one)."""
    assert command[0] == "draftgate"
    args = list(command[1:])
    if "--port" in args:
        at = args.index("--port")
        del args[at : at + 2]
    if "--host" in args:
        args[args.index("--host") + 1] = "127.0.0.1"
    return tuple(args)


def local_env(service: dict[str, Any], variables: dict[str, str], **local: str) -> dict[str, str]:
    """The service's environment as compose would set it, with `local` replacing values
    that name compose's network (the database URL, mounted paths)."""
    env = {k: interpolate(str(v), variables) for k, v in service.get("environment", {}).items()}
    return draftgate_env(**(env | local))


def local_fleet(
    compose: dict[str, Any], fleet_path: str, sims: dict[str, Server], into: Path
) -> Path:
    """The mounted fleet file, its backend URLs pointed at the local simulators."""
    mount = next(v for v in compose["services"]["gateway"]["volumes"] if ":/etc/draftgate" in v)
    source = Path(COMPOSE.parent, mount.split(":")[0]) / Path(fleet_path).relative_to(
        "/etc/draftgate"
    )
    fleet = yaml.safe_load(source.read_text(encoding="utf-8"))
    for backend in fleet["backends"]:
        assert backend["url"] == f"http://{backend['name']}:{_port_of(compose, backend['name'])}"
        backend["url"] = sims[backend["name"]].base_url
    path = into / source.name
    path.write_text(yaml.safe_dump(fleet, sort_keys=False), encoding="utf-8")
    return path


def _port_of(compose: dict[str, Any], name: str) -> int:
    command = compose["services"][name]["command"]
    return int(command[command.index("--port") + 1])


def wait_ready(server: Server, timeout_s: float = READY_TIMEOUT_S) -> dict[str, Any]:
    """Poll GET /ready until 200; its body."""
    deadline, last = time.monotonic() + timeout_s, ""
    with httpx.Client(base_url=server.base_url, timeout=5.0) as http:
        while time.monotonic() < deadline:
            response = http.get("/ready")
            if response.status_code == 200:
                body: dict[str, Any] = response.json()
                return body
            last = response.text
            time.sleep(0.5)
    pytest.fail(f"{server.base_url}/ready not 200 within {timeout_s} s: {last}")


def declared_metric_names(exposition: str) -> set[str]:
    """Every sample name the exposition's families can carry, declared even before a sample."""
    suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"], "gauge": [""]}
    return {
        family.name + suffix
        for family in text_string_to_metric_families(exposition)
        for suffix in suffixes.get(family.type, [""])
    }


@pytest.fixture
def sim_stack(
    compose: dict[str, Any],
    postgres_schema: str,
    run_cli: CliRunner,
    start_server: ServerStarter,
    tmp_path: Path,
) -> tuple[list[Server], dict[str, Server], str, str]:
    """migrate, the sim profile's simulators and two gateway replicas on one PostgreSQL;
    (replicas, simulators by service name, a client API key, the database URL)."""
    variables = VARIABLES
    services = compose["services"]
    database = {"DRAFTGATE_DATABASE_URL": postgres_schema}

    migrate = services["migrate"]
    done = run_cli(*local_args(migrate["command"]), env=local_env(migrate, variables, **database))
    assert done.returncode == 0, done.stderr
    assert re.search(r"database upgraded from empty to revision \w+", done.stdout), done.stdout

    sims = {
        name: start_server(*local_args(s["command"]), env=draftgate_env(), wait=False)
        for name, s in services_in(compose, "sim").items()
    }
    for sim in sims.values():
        sim.wait_healthy(READY_TIMEOUT_S)

    gateway = services["gateway"]
    fleet = local_fleet(
        compose, interpolate(gateway["environment"]["DRAFTGATE_FLEET"], variables), sims, tmp_path
    )
    env = local_env(gateway, variables, DRAFTGATE_FLEET=str(fleet), **database)
    assert env["DRAFTGATE_MIGRATE_ON_START"] == "false"
    assert env["DRAFTGATE_REQUIRE_API_KEY"] == "true"
    # Every replica starts at once, as `deploy.replicas` starts them, applying the same fleet.
    replicas = [
        start_server(*local_args(gateway["command"]), env=env, wait=False)
        for _ in range(gateway["deploy"]["replicas"])
    ]
    for replica in replicas:
        replica.wait_healthy(READY_TIMEOUT_S)

    # As the compose file's header says: `docker compose run --rm migrate draftgate keys create`.
    created = run_cli(
        "keys", "create", "compose-e2e", env=local_env(migrate, variables, **database)
    )
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip().splitlines()[-1]
    for replica in replicas:  # a key made beside the gateway reaches it on its next refresh
        wait_key_known(replica, key)
    return replicas, sims, key, postgres_schema


# A key made beside the gateway reaches each of a replica's worker processes on that
# worker's own refresh; the kernel picks a worker per connection, so the key is known to the
# replica once this many fresh connections in a row accept it (a worker that does not know
# it yet breaks the run, and it starts again).
ACCEPTED_IN_A_ROW = 12


def wait_key_known(server: Server, key: str, timeout_s: float = READY_TIMEOUT_S) -> None:
    """Poll GET /v1/models with `key`, a new connection each time, until every worker of
    the replica accepts it."""
    deadline, last, in_a_row = time.monotonic() + timeout_s, "", 0
    headers = {"Authorization": f"Bearer {key}"}
    fresh = httpx.Limits(max_keepalive_connections=0)
    with httpx.Client(base_url=server.base_url, timeout=5.0, headers=headers, limits=fresh) as http:
        while time.monotonic() < deadline:
            response = http.get("/v1/models")
            if response.status_code == 200:
                in_a_row += 1
                if in_a_row == ACCEPTED_IN_A_ROW:
                    return
                continue
            in_a_row, last = 0, response.text
            time.sleep(0.2)
    pytest.fail(f"{server.base_url} did not accept the new key within {timeout_s} s: {last}")


def test_sim_profile_serves_openai_clients_through_every_replica(
    sim_stack: tuple[list[Server], dict[str, Server], str, str],
    compose: dict[str, Any],
    start_server: ServerStarter,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    replicas, sims, key, database_url = sim_stack
    assert len(replicas) == 2
    for replica in replicas:
        assert wait_ready(replica)["backends_healthy"] == len(sims)
    rows = query_rows(database_url, "SELECT name FROM backends ORDER BY name")
    assert sorted(r["name"] for r in rows) == sorted(sims)  # applied twice, registered once

    request_ids = []
    for replica in replicas:
        client = openai.OpenAI(
            base_url=f"{replica.base_url}/v1", api_key=key, max_retries=0, timeout=REQUEST_TIMEOUT_S
        )
        request_ids.append(_serve_through(client, set(sims)))
        with (
            pytest.raises(openai.AuthenticationError),
            openai.OpenAI(
                base_url=f"{replica.base_url}/v1", api_key="not-a-key", max_retries=0
            ) as stranger,
        ):
            stranger.models.list()

    # Both replicas write their usage to the one database.
    records = wait_for_usage_records(database_url, request_ids)
    assert {r["backend_name"] for r in records.values()} <= set(sims)
    assert {r["api_key_id"] for r in records.values()} != {None}

    # Grafana's queries name metrics that the gateway and a spec-decode simulator expose.
    exposed: set[str] = set()
    for server in [*replicas, sims["sim-dspark"]]:
        exposed |= declared_metric_names(httpx.get(f"{server.base_url}/metrics", timeout=10).text)
    used = grafana_metric_names()
    assert any(n.startswith("vllm:spec_decode_") for n in used)
    assert any(n.startswith("draftgate_") for n in used)
    assert used <= exposed, f"not exposed by anything: {sorted(used - exposed)}"

    # The dashboard's command serves Streamlit where its healthcheck looks.
    dashboard = compose["services"]["dashboard"]
    env = local_env(dashboard, VARIABLES, DRAFTGATE_DASHBOARD_GATEWAY_URL=replicas[0].base_url)
    streamlit = start_server(*local_args(dashboard["command"]), env=env, wait=False)
    assert wait_for_body(streamlit, "/_stcore/health") == "ok"
    check_dashboards(compose, replicas[0], streamlit, env, start_server, monkeypatch)


def dashboard_client(
    env: dict[str, str], command: list[str], monkeypatch: pytest.MonkeyPatch
) -> AdminClient:
    """The admin API client a dashboard's pages make from its environment and command
    (`--admin` turns DRAFTGATE_DASHBOARD_ADMIN on, as `draftgate dashboard` does)."""
    for name in [n for n in os.environ if n.startswith("DRAFTGATE_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        if name.startswith("DRAFTGATE_"):
            monkeypatch.setenv(name, value)
    if parse_draftgate(command).params["admin"]:
        monkeypatch.setenv("DRAFTGATE_DASHBOARD_ADMIN", "true")
    return admin_client(DashboardSettings())


def host_status(server: Server, host: str, path: str = "/") -> int:
    """The status `server` answers GET `path` with when the request names `host`."""
    response = httpx.get(server.base_url + path, headers={"Host": host}, timeout=10.0)
    return response.status_code


def check_dashboards(
    compose: dict[str, Any],
    gateway: Server,
    reader: Server,
    env: dict[str, str],
    start_server: ServerStarter,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The published dashboard (`reader`, started with `env`) reads by default; the login
    profile's acts as admin, answering only the name oauth2-proxy passes on."""
    absent_key = 10**9  # revoking it: 404 for an admin, 403 for a reader, before any lookup

    # The published dashboard: the read token only, so its pages can change nothing.
    dashboard = compose["services"]["dashboard"]
    assert "DRAFTGATE_ADMIN_TOKEN" not in env
    client = dashboard_client(env, dashboard["command"], monkeypatch)
    assert client.scope() == "read"  # GET /admin/v1/whoami with the dashboard's token
    with pytest.raises(AdminApiError) as refused:
        client.revoke_key(absent_key)
    assert refused.value.status_code == 403, refused.value.message
    # It answers the names a browser uses for 127.0.0.1:8501, and no other but for its probe.
    assert host_status(reader, "localhost:8501") == 200
    assert host_status(reader, "127.0.0.1:8501") == 200
    assert host_status(reader, "rebound.example.com:8501") == 403
    assert host_status(reader, "rebound.example.com", "/_stcore/health") == 200

    # The login profile's: the admin token, answering only the name oauth2-proxy passes on.
    admin = compose["services"]["dashboard-admin"]
    env = local_env(admin, VARIABLES, DRAFTGATE_DASHBOARD_GATEWAY_URL=gateway.base_url)
    assert "DRAFTGATE_ADMIN_READ_TOKEN" not in env
    actor = start_server(*local_args(admin["command"]), env=env, wait=False)
    assert wait_for_body(actor, "/_stcore/health") == "ok"
    client = dashboard_client(env, admin["command"], monkeypatch)
    assert client.scope() == "admin"
    with pytest.raises(AdminApiError) as missing:
        client.revoke_key(absent_key)
    assert missing.value.status_code == 404, missing.value.message
    proxy = compose["services"]["oauth2-proxy"]["environment"]
    public = urlsplit(interpolate(proxy["OAUTH2_PROXY_REDIRECT_URL"], VARIABLES)).netloc
    assert host_status(actor, public) == 200  # the Host of the browser, passed through
    assert host_status(actor, "127.0.0.1:8501") == 403
    assert host_status(actor, "dashboard-admin:8501") == 403


def _serve_through(client: openai.OpenAI, sims: set[str]) -> str:
    """A chat and a streamed chat through one replica; the chat's request id."""
    request_id = f"compose-{uuid.uuid4().hex}"
    with client:
        raw = client.chat.completions.with_raw_response.create(
            model="openai/gpt-oss-20b",
            messages=[{"role": "user", "content": "Say hello."}],
            max_tokens=16,
            extra_headers={"x-request-id": request_id},
        )
        completion = raw.parse()
        assert completion.choices[0].message.content
        assert completion.usage is not None
        assert completion.usage.completion_tokens > 0
        assert raw.headers["x-draftgate-backend"] in sims
        stream = client.chat.completions.create(
            model="openai/gpt-oss-20b",
            messages=[{"role": "user", "content": "Count to five."}],
            max_tokens=16,
            stream=True,
        )
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    return request_id


def wait_for_body(server: Server, path: str, timeout_s: float = READY_TIMEOUT_S) -> str:
    """Poll GET `path` until it answers 200; its body."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(base_url=server.base_url, timeout=5.0) as http:
        while time.monotonic() < deadline:
            try:
                response = http.get(path)
                if response.status_code == 200:
                    return response.text
            except httpx.TransportError:
                pass
            assert server.process.poll() is None, server.output()
            time.sleep(0.5)
    pytest.fail(f"{server.base_url}{path} did not answer within {timeout_s} s: {server.output()}")
