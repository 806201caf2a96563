"""The docker compose file, its mounted configuration and the Dockerfile, checked offline.

No Docker engine runs here, so the file is validated against the compose specification's
JSON schema and every piece is checked against the code it must agree with: commands
against the real `draftgate` command line, ports and health checks against the settings
defaults, `--speculative-config` against backends/methods.py, fleet files against the
gateway's loader, scrape targets against the services, the `login` profile's oauth2-proxy
against the dashboard it guards. tests/e2e/test_compose_stack.py runs the `sim` profile's
commands, and the dashboards', as local processes.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import setuptools
import typer.main
import yaml
from typer.core import TyperGroup
from typer.exceptions import TyperException

from backends.compose import VLLM_IMAGE, vllm_command, vllm_service
from backends.methods import make_spec, render_speculative_config
from backends.sim.config import DEFAULT_K
from dashboard.server import host_allowed
from gateway.cli import stack
from gateway.cli.main import app
from gateway.services.fleet import Fleet, load_fleet
from gateway.settings import Settings
from planner.catalog import default_prices
from tests.unit.k8s_queries import OAUTH2_PROXY_REQUIRED, oauth2_proxy_options
from tests.unit.test_alerts import alerting_rules, exported_metric_names, metric_names

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
DEPLOY = ROOT / "deploy" / "compose"
CHECK_JSONSCHEMA = Path(sys.executable).parent / "check-jsonschema"
PROMTOOL = shutil.which("promtool")
PROFILES = ("sim", "gpu")  # the backends' profiles
LOGIN_PROFILE = "login"
# What `docker compose up` needs set, whatever the profiles: compose reads every service's
# variables even when its profile is off.
REQUIRED_VARIABLES = {
    "DRAFTGATE_ADMIN_TOKEN",
    "DRAFTGATE_ADMIN_READ_TOKEN",
    "GRAFANA_ADMIN_PASSWORD",
}
VARIABLE = re.compile(r"\$\{(\w+)(?::([-?])([^}]*))?\}")
GPU_MODEL = "Qwen/Qwen3-8B"
# The drafters the gpu profile serves, one per method (the published Qwen3-8B drafters).
GPU_DRAFTERS = {
    "plain": None,
    "eagle3": "RedHatAI/Qwen3-8B-speculator.eagle3",
    "p-eagle": "RedHatAI/Qwen3-8B-speculator.peagle",
    "dflash": "z-lab/Qwen3-8B-DFlash-b16",
    "dspark": "deepseek-ai/dspark_qwen3_8b_block7",
}
# K per method: EAGLE-3 peaks at K=3 and P-EAGLE at K=7 (published sweeps); the DFlash
# drafter is trained on blocks of 16 (15 drafted tokens), the DSpark one on blocks of 7.
GPU_K = {"eagle3": 3, "p-eagle": 7, "dflash": 15, "dspark": 7}


# --- reading the files ---


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    """The parsed compose file (YAML merge keys resolved, as compose resolves them)."""
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    return loaded


def services_in(compose: dict[str, Any], profile: str | None) -> dict[str, dict[str, Any]]:
    """The services of `profile` (None: those without a profile, which always run)."""
    return {
        name: service
        for name, service in compose["services"].items()
        if (profile is None and not service.get("profiles"))
        or profile in service.get("profiles", [])
    }


def fleet_of(profile: str) -> Fleet:
    return load_fleet(DEPLOY / f"fleet-{profile}.yaml")


def _text(value: str | list[str]) -> str:
    return value if isinstance(value, str) else " ".join(value)


def _host_ip(mapping: str | dict[str, Any]) -> str | None:
    """The host address of a short (`IP:HOST:CONTAINER`) or long port mapping."""
    if isinstance(mapping, dict):
        return mapping.get("host_ip")
    parts = str(mapping).split(":")
    return parts[0] if len(parts) == 3 else None


def _container_port(mapping: str) -> int:
    return int(str(mapping).rsplit(":", 1)[1])


def _health_port(service: dict[str, Any], path: str) -> int:
    """The port the service's healthcheck asks `path` on, at 127.0.0.1."""
    match = re.search(
        rf"http://127\.0\.0\.1:(\d+){re.escape(path)}", _text(service["healthcheck"]["test"])
    )
    assert match, f"healthcheck {service['healthcheck']['test']} does not ask {path}"
    return int(match[1])


def parse_draftgate(argv: list[str]) -> Any:
    """Parse a `draftgate ...` command line with the real CLI, without running it.

    Sub-command groups are followed by name; the last command parses its options (types,
    ranges, unknown flags) exactly as `draftgate` would, and leaves nothing unparsed.
    """
    assert argv[0] == "draftgate", argv
    command: Any = typer.main.get_command(app)
    args, name = argv[1:], "draftgate"
    while isinstance(command, TyperGroup) and args and args[0] in command.commands:
        name, command, args = args[0], command.commands[args[0]], args[1:]
    context = command.make_context(name, list(args))
    assert not context.args, f"{argv}: left unparsed: {context.args}"
    assert not getattr(context, "_protected_args", []), f"{argv}: unknown sub-command"
    return context


def command_default(path: list[str], option: str) -> object:
    """The default of `option` of the `draftgate` sub-command at `path`."""
    command: Any = typer.main.get_command(app)
    for name in path:
        assert isinstance(command, TyperGroup)
        command = command.commands[name]
    return next(p.default for p in command.params if p.name == option)


# --- the compose file as a whole ---


def _validate(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CHECK_JSONSCHEMA), "--builtin-schema", "vendor.compose-spec", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_compose_file_matches_the_compose_spec() -> None:
    result = _validate(COMPOSE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_schema_check_refuses_a_broken_compose_file(tmp_path: Path) -> None:
    broken = COMPOSE.read_text(encoding="utf-8").replace(
        "  gateway:\n", "  gateway:\n    replica: 2\n", 1
    )
    (tmp_path / "docker-compose.yml").write_text(broken, encoding="utf-8")
    result = _validate(tmp_path / "docker-compose.yml")
    assert result.returncode != 0
    assert "replica" in result.stdout + result.stderr


def test_every_published_port_binds_loopback(compose: dict[str, Any]) -> None:
    mappings = [
        (name, mapping)
        for name, service in compose["services"].items()
        for mapping in service.get("ports", [])
    ]
    assert {name for name, _ in mappings} >= {
        "lb",
        "dashboard",
        "prometheus",
        "grafana",
        "oauth2-proxy",
    }
    for name, mapping in mappings:
        assert _host_ip(mapping) == "127.0.0.1", f"{name} publishes {mapping!r} beyond loopback"


def test_secrets_come_from_variables(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name in ("gateway", "dashboard-admin"):
        token = services[name]["environment"]["DRAFTGATE_ADMIN_TOKEN"]
        assert token.startswith("${DRAFTGATE_ADMIN_TOKEN:?"), f"{name}: {token}"
    for name in ("gateway", "dashboard"):
        token = services[name]["environment"]["DRAFTGATE_ADMIN_READ_TOKEN"]
        assert token.startswith("${DRAFTGATE_ADMIN_READ_TOKEN:?"), f"{name}: {token}"
    # The published dashboard holds the read token only: its pages can change nothing.
    assert "DRAFTGATE_ADMIN_TOKEN" not in services["dashboard"]["environment"]
    assert "DRAFTGATE_ADMIN_READ_TOKEN" not in services["dashboard-admin"]["environment"]
    proxy = services["oauth2-proxy"]["environment"]
    for name in ("OAUTH2_PROXY_CLIENT_SECRET", "OAUTH2_PROXY_COOKIE_SECRET"):
        assert proxy[name] == "${" + name + ":-}", name
    grafana = services["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD"]
    assert grafana.startswith("${GRAFANA_ADMIN_PASSWORD:?")
    for service in services_in(compose, "gpu").values():
        assert service["environment"]["HF_TOKEN"].startswith("${HF_TOKEN")


def test_services_without_a_profile_depend_only_on_services_without_one(
    compose: dict[str, Any],
) -> None:
    """`docker compose up` with no profile (or either one) starts a coherent set: nothing
    waits on a service its profile set leaves out, and each profile runs every method."""
    services = compose["services"]
    for name, service in services.items():
        own = set(service.get("profiles", []))
        for needed in service.get("depends_on", {}):
            theirs = set(services[needed].get("profiles", []))
            assert not theirs or theirs & own, f"{name} depends on {needed} of profile {theirs}"
    assert sorted(services_in(compose, None)) == sorted(
        ["postgres", "migrate", "gateway", "lb", "dashboard", "prometheus", "grafana"]
    )
    for profile in PROFILES:
        methods = {b.method for b in fleet_of(profile).backends}
        assert methods == set(GPU_DRAFTERS), profile


def test_the_stack_needs_no_login_variable_without_the_login_profile() -> None:
    """Compose interpolates the whole file before it looks at profiles: a `${VAR:?}` in the
    login profile would stop `docker compose up` for everyone who does not use it."""
    text = COMPOSE.read_text(encoding="utf-8")
    found = [m for m in VARIABLE.finditer(text) if not _in_comment(text, m.start())]
    assert {m[1] for m in found if m[2] == "?"} == REQUIRED_VARIABLES
    login = yaml.safe_dump(services_in(yaml.safe_load(text), LOGIN_PROFILE))
    own = {m[1] for m in VARIABLE.finditer(login)} - REQUIRED_VARIABLES
    assert {"OAUTH2_PROXY_CLIENT_ID", "DRAFTGATE_DASHBOARD_PUBLIC_HOST"} <= own
    for match in found:
        if match[1] in own:
            assert match[2] == "-", f"{match[0]}: the login profile's variables need a default"


def _in_comment(text: str, at: int) -> bool:
    line = text[text.rfind("\n", 0, at) + 1 : at]
    return line.lstrip().startswith("#")


def test_every_bind_mount_exists_in_the_repository(compose: dict[str, Any]) -> None:
    mounts = [
        volume.split(":")[0]
        for service in compose["services"].values()
        for volume in service.get("volumes", [])
        if volume.startswith("./")
    ]
    assert "./deploy/compose" in mounts
    for source in mounts:
        assert (ROOT / source).exists(), f"{source} is mounted but missing"


def test_named_volumes_are_declared(compose: dict[str, Any]) -> None:
    used = {
        volume.split(":")[0]
        for service in compose["services"].values()
        for volume in service.get("volumes", [])
        if not volume.startswith(("./", "/"))
    }
    assert (
        used == set(compose["volumes"]) == {"pgdata", "prometheus-data", "grafana-data", "hf-cache"}
    )


# --- the draftgate services: real commands, the settings' ports, the right order ---


def test_every_draftgate_command_is_a_real_sub_command_with_valid_flags(
    compose: dict[str, Any],
) -> None:
    commands = {
        name: s["command"]
        for name, s in compose["services"].items()
        if s.get("command", [""])[0] == "draftgate"
    }
    assert set(commands) >= {
        "migrate",
        "gateway",
        "dashboard",
        "dashboard-admin",
        *services_in(compose, "sim"),
    }
    for name, argv in commands.items():
        context = parse_draftgate(argv)
        assert context.command.callback is not None, name


def test_the_parser_refuses_an_unknown_flag_or_sub_command() -> None:
    with pytest.raises(TyperException, match="No such option"):
        parse_draftgate(["draftgate", "gateway", "--replicas", "2"])
    with pytest.raises(TyperException, match="65535"):
        parse_draftgate(["draftgate", "sim", "--model", "m", "--port", "70000"])
    with pytest.raises(AssertionError):
        parse_draftgate(["draftgate", "db", "downgrade"])


def test_commands_in_the_compose_file_s_comments_are_real(compose: dict[str, Any]) -> None:
    """`docker compose run --rm SERVICE draftgate ...` in the header runs in a service that has
    the database, and parses."""
    runs = re.findall(r"`docker compose run --rm ([\w-]+) (draftgate [^`]+)`", COMPOSE.read_text())
    assert runs
    for service, command in runs:
        assert "DRAFTGATE_DATABASE_URL" in compose["services"][service]["environment"]
        parse_draftgate(command.replace("NAME", "demo").split())


def test_migrate_runs_once_before_the_gateway(compose: dict[str, Any]) -> None:
    services = compose["services"]
    migrate, gateway = services["migrate"], services["gateway"]
    assert parse_draftgate(migrate["command"]).command.name == "upgrade"
    assert migrate["restart"] == "no"
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert gateway["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert gateway["environment"]["DRAFTGATE_MIGRATE_ON_START"] == "false"
    assert (
        migrate["environment"]["DRAFTGATE_DATABASE_URL"]
        == gateway["environment"]["DRAFTGATE_DATABASE_URL"]
    )
    assert "@postgres:5432/" in gateway["environment"]["DRAFTGATE_DATABASE_URL"]
    assert "pg_isready" in _text(services["postgres"]["healthcheck"]["test"])


def test_gateway_replicas_listen_where_the_load_balancer_and_health_check_look(
    compose: dict[str, Any],
) -> None:
    services = compose["services"]
    gateway, lb = services["gateway"], services["lb"]
    port = parse_draftgate(gateway["command"]).params["port"]
    assert port == Settings.model_fields["port"].default == 8080
    assert parse_draftgate(gateway["command"]).params["host"] == "0.0.0.0"  # noqa: S104
    assert _health_port(gateway, "/ready") == port
    assert gateway["deploy"]["replicas"] >= 2
    assert "ports" not in gateway, "replicas share one published port through the load balancer"
    assert [_container_port(m) for m in lb["ports"]] == [port]
    nginx = (DEPLOY / "nginx.conf").read_text(encoding="utf-8")
    assert re.search(rf"^\s*listen {port};", nginx, re.MULTILINE)
    assert re.search(rf"^\s*server gateway:{port} resolve", nginx, re.MULTILINE)
    assert "resolver 127.0.0.11" in nginx  # Docker's DNS: every replica of `gateway`
    assert re.search(r"^\s*proxy_buffering off;", nginx, re.MULTILINE)  # streams pass through


def test_nginx_config_is_well_formed() -> None:
    """Braces balance and every directive ends with `;` (no nginx binary here to ask)."""
    depth = 0
    for number, raw in enumerate((DEPLOY / "nginx.conf").read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        depth += line.count("{") - line.count("}")
        assert depth >= 0, f"line {number}: unbalanced '}}'"
        assert line.endswith((";", "{", "}")), f"line {number}: {line!r} does not end a directive"
    assert depth == 0


def test_gateway_applies_the_fleet_file_of_the_chosen_profile(compose: dict[str, Any]) -> None:
    gateway = compose["services"]["gateway"]
    fleet = gateway["environment"]["DRAFTGATE_FLEET"]
    assert fleet == "/etc/draftgate/${DRAFTGATE_COMPOSE_FLEET:-fleet-sim.yaml}"
    assert "./deploy/compose:/etc/draftgate:ro" in gateway["volumes"]
    for profile in PROFILES:
        assert (DEPLOY / f"fleet-{profile}.yaml").is_file()


def test_dashboard_reads_the_admin_api_behind_the_load_balancer(compose: dict[str, Any]) -> None:
    dashboard = compose["services"]["dashboard"]
    port = parse_draftgate(dashboard["command"]).params["port"]
    assert port == command_default(["dashboard"], "port") == 8501
    assert [_container_port(m) for m in dashboard["ports"]] == [port]
    assert _health_port(dashboard, "/_stcore/health") == port
    assert dashboard["environment"]["DRAFTGATE_DASHBOARD_GATEWAY_URL"] == "http://lb:8080"


def test_published_dashboard_is_read_only_and_answers_loopback_names(
    compose: dict[str, Any],
) -> None:
    dashboard = compose["services"]["dashboard"]
    assert parse_draftgate(dashboard["command"]).params["admin"] is False
    allowed = dashboard["environment"]["DRAFTGATE_DASHBOARD_ALLOWED_HOSTS"].split(",")
    [published] = dashboard["ports"]
    port = published.rsplit(":", 1)[0].split(":")[1]
    for host in ("localhost", "127.0.0.1"):  # what a browser types for 127.0.0.1:8501
        assert host_allowed(f"{host}:{port}", allowed), host
    assert not host_allowed("rebound.example.com:8501", allowed)


# --- the login profile: the admin dashboard behind oauth2-proxy ---


def _unset(value: str) -> str:
    """`value` as compose gives it with none of its variables set (their defaults)."""
    return VARIABLE.sub(lambda m: m[3] if m[2] == "-" else "", value)


def test_login_profile_is_an_admin_dashboard_reached_only_through_oauth2_proxy(
    compose: dict[str, Any],
) -> None:
    login = services_in(compose, LOGIN_PROFILE)
    assert set(login) == {"dashboard-admin", "oauth2-proxy"}
    dashboard, proxy = login["dashboard-admin"], login["oauth2-proxy"]
    params = parse_draftgate(dashboard["command"]).params
    assert params["admin"] is True
    assert params["host"] == "0.0.0.0"  # noqa: S104
    assert _health_port(dashboard, "/_stcore/health") == params["port"]
    assert "ports" not in dashboard, "the admin dashboard is reached only through the login"
    assert dashboard["environment"]["DRAFTGATE_DASHBOARD_GATEWAY_URL"] == "http://lb:8080"

    image, _, tag = proxy["image"].rpartition(":")
    assert image == "quay.io/oauth2-proxy/oauth2-proxy"
    assert re.fullmatch(r"v\d+\.\d+\.\d+", tag), "pin the image to a release"
    env = {k: _unset(str(v)) for k, v in proxy["environment"].items()}
    options = oauth2_proxy_options(proxy.get("command", []), env)
    assert options.keys() >= OAUTH2_PROXY_REQUIRED, OAUTH2_PROXY_REQUIRED - options.keys()
    assert options["provider"] == "oidc"
    assert options["upstreams"] == f"http://dashboard-admin:{params['port']}"
    # The dashboard needs the browser's Host and its WebSocket; clients' X-Forwarded-* are
    # not trusted unless a proxy in front is declared.
    assert options.get("pass_host_header", "true") == "true"
    assert options.get("proxy_websockets", "true") == "true"
    assert options["reverse_proxy"] == "false"
    assert proxy["depends_on"]["dashboard-admin"]["condition"] == "service_healthy"
    # Published on loopback only, on the port it listens on and its redirect URL names.
    host, _, listen = options["http_address"].rpartition(":")
    assert host == "0.0.0.0"  # noqa: S104
    assert proxy["ports"] == [f"127.0.0.1:{listen}:{listen}"]
    redirect = urlsplit(options["redirect_url"])
    assert (redirect.hostname, redirect.port, redirect.path) == (
        "localhost",
        int(listen),
        "/oauth2/callback",
    )
    # oauth2-proxy passes the browser's Host through; the dashboard answers that name only.
    allowed = _unset(dashboard["environment"]["DRAFTGATE_DASHBOARD_ALLOWED_HOSTS"]).split(",")
    assert host_allowed(redirect.netloc, allowed)
    assert not host_allowed("dashboard-admin:8501", allowed)
    # The file's header says how to use it, with the URL to register.
    text = COMPOSE.read_text(encoding="utf-8")
    assert "docker compose --profile sim --profile login up -d" in text
    assert f"redirect URL {options['redirect_url']}" in text


# --- the sim profile: the same five simulators as `draftgate up` ---


def test_sim_services_are_draftgate_up_s_simulators(compose: dict[str, Any]) -> None:
    sims = services_in(compose, "sim")
    base_port = command_default(["up"], "sim_base_port")
    assert isinstance(base_port, int)
    expected = stack.demo_backends(base_port)
    assert len(sims) == len(expected) == 5
    for (name, service), backend in zip(sims.items(), expected, strict=True):
        params = parse_draftgate(service["command"]).params
        assert name == f"sim-{backend.method}"
        assert (params["model"], params["method"], params["gpu"]) == (
            stack.DEMO_MODEL,
            backend.method,
            stack.DEMO_GPU,
        )
        assert params["k"] == DEFAULT_K.get(backend.method)
        assert params["port"] == backend.url.port
        assert params["host"] == "0.0.0.0"  # noqa: S104
        assert _health_port(service, "/health") == params["port"]


def test_sim_fleet_registers_every_simulator_as_draftgate_up_does(compose: dict[str, Any]) -> None:
    sims = services_in(compose, "sim")
    fleet = {b.name: b for b in fleet_of("sim").backends}
    assert set(fleet) == set(sims)
    demo = {b.method: b for b in stack.demo_backends(8101)}
    for name, service in sims.items():
        params, entry = parse_draftgate(service["command"]).params, fleet[name]
        assert str(entry.url) == f"http://{name}:{params['port']}/"
        assert (entry.model, entry.method, entry.k, entry.gpu_type) == (
            params["model"],
            params["method"],
            params["k"],
            params["gpu"],
        )
        assert entry.drafter == demo[entry.method].drafter


# --- the gpu profile: real vLLM with the catalog's exact speculative configs ---


def test_gpu_services_serve_every_method_with_the_rendered_speculative_config(
    compose: dict[str, Any],
) -> None:
    gpus = services_in(compose, "gpu")
    fleet = {b.name: b for b in fleet_of("gpu").backends}
    assert set(gpus) == set(fleet) == {f"vllm-{m}" for m in GPU_DRAFTERS}
    for name, service in gpus.items():
        entry = fleet[name]
        assert str(entry.url) == f"http://{name}:8000/"
        assert (entry.model, entry.drafter, entry.k) == (
            GPU_MODEL,
            GPU_DRAFTERS[entry.method],
            GPU_K.get(entry.method),
        )
        spec = make_spec(entry.method, entry.k, entry.drafter)
        assert entry.scheduling == "priority"
        command = vllm_command(entry.model, spec, scheduling=entry.scheduling)
        assert service["command"] == command, name
        argv, flag = service["command"], "--speculative-config"
        config = json.loads(argv[argv.index(flag) + 1]) if flag in argv else None
        assert config == render_speculative_config(spec), name


def test_gpu_speculative_configs_are_the_design_s(compose: dict[str, Any]) -> None:
    """The configs spelled out, so a change in the renderer cannot pass unnoticed."""
    configs = {}
    for name, service in services_in(compose, "gpu").items():
        argv = service["command"]
        flag = "--speculative-config"
        configs[name] = json.loads(argv[argv.index(flag) + 1]) if flag in argv else None
    k = "num_speculative_tokens"
    assert configs == {
        "vllm-plain": None,
        "vllm-eagle3": {"method": "eagle3", "model": GPU_DRAFTERS["eagle3"], k: 3},
        "vllm-p-eagle": {
            "method": "eagle3",
            "model": GPU_DRAFTERS["p-eagle"],
            k: 7,
            "parallel_drafting": True,
        },
        "vllm-dflash": {"method": "dflash", "model": GPU_DRAFTERS["dflash"], k: 15},
        "vllm-dspark": {"method": "dspark", "model": GPU_DRAFTERS["dspark"], k: 7},
    }


def _default_of(value: str) -> str:
    """The default of a `${NAME:-default}` interpolation."""
    match = re.fullmatch(r"\$\{[A-Z0-9_]+:-([^}]*)\}", value)
    assert match, value
    return match.group(1)


def test_gpu_services_reserve_a_gpu_each_cache_weights_and_check_health(
    compose: dict[str, Any],
) -> None:
    taken: dict[str, str] = {}
    for name, service in services_in(compose, "gpu").items():
        [device] = service["deploy"]["resources"]["reservations"]["devices"]
        [gpu] = device["device_ids"]
        first_gpu = int(_default_of(gpu))
        assert first_gpu not in taken.values(), f"{name} shares GPU {first_gpu}"
        taken[name] = str(first_gpu)
        rendered = vllm_service(GPU_MODEL, make_spec("plain"), first_gpu=first_gpu)
        for key in ("environment", "volumes", "ipc", "healthcheck"):
            assert service[key] == rendered[key], f"{name}.{key}"
        resolved = {**device, "device_ids": [str(first_gpu)]}
        assert rendered["deploy"] == {"resources": {"reservations": {"devices": [resolved]}}}
        assert _default_of(service["image"]) == rendered["image"] == "vllm/vllm-openai:v0.32.0"
        assert _health_port(service, "/health") == int(service["command"][-1]) == 8000
    assert sorted(taken.values()) == ["0", "1", "2", "3", "4"]


def test_fleet_files_load_and_price_their_gpus_at_the_planner_s_list_prices() -> None:
    defaults = {(p.gpu_type, p.kind): p for p in default_prices()}
    for profile in PROFILES:
        fleet = fleet_of(profile)
        assert fleet.backends
        assert [m.policy.mode for m in fleet.models] == ["auto"]
        assert {b.model for b in fleet.backends} == {m.name for m in fleet.models}
        priced = {(p.gpu_type, p.kind) for p in fleet.prices}
        assert {(b.gpu_type, "on-demand") for b in fleet.backends} <= priced
        for price in fleet.prices:
            default = defaults[(price.gpu_type, price.kind)]
            assert (price.usd_per_gpu_hour, price.source, price.date) == (
                default.usd_per_gpu_hour,
                default.source,
                default.date,
            )


# --- Prometheus and Grafana ---


def _scrape_targets() -> dict[str, set[tuple[str, int]]]:
    """(DNS name, port) of every target, by job."""
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text(encoding="utf-8"))
    return {
        job["job_name"]: {
            (n, sd["port"]) for sd in job.get("dns_sd_configs", []) for n in sd["names"]
        }
        for job in config["scrape_configs"]
    }


def test_prometheus_scrapes_every_gateway_replica_and_every_backend(
    compose: dict[str, Any],
) -> None:
    targets = set().union(*_scrape_targets().values())
    assert ("gateway", 8080) in targets  # an A record per replica
    for profile in PROFILES:
        for backend in fleet_of(profile).backends:
            host, port = backend.url.host, backend.url.port
            assert host in services_in(compose, profile)
            assert (host, port) in targets, f"{backend.name} is not scraped"
    prometheus = compose["services"]["prometheus"]
    assert (
        "./deploy/compose/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in prometheus["volumes"]
    )


@pytest.mark.skipif(PROMTOOL is None, reason="no promtool (make test installs it)")
def test_prometheus_loads_the_alerting_rules_mounted_beside_its_config(
    compose: dict[str, Any],
) -> None:
    """The container reads /etc/prometheus/prometheus.yml and finds `rule_files` beside it:
    the same layout as deploy/compose/, so promtool checks both as Prometheus will load them."""
    volumes = compose["services"]["prometheus"]["volumes"]
    assert "./deploy/compose/alerts.yml:/etc/prometheus/alerts.yml:ro" in volumes
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text(encoding="utf-8"))
    assert config["rule_files"] == ["alerts.yml"]
    checked = subprocess.run(
        [str(PROMTOOL), "check", "config", "prometheus.yml"],
        cwd=DEPLOY,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 1 rule files found" in checked.stdout


def test_grafana_is_provisioned_with_the_dashboard_and_data_source(compose: dict[str, Any]) -> None:
    grafana = compose["services"]["grafana"]
    provisioning = DEPLOY / "grafana" / "provisioning"
    source = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())
    [datasource] = source["datasources"]
    assert datasource["url"] == "http://prometheus:9090"
    assert [_container_port(m) for m in compose["services"]["prometheus"]["ports"]] == [9090]
    provider = yaml.safe_load((provisioning / "dashboards" / "draftgate.yml").read_text())
    path = provider["providers"][0]["options"]["path"]
    assert f"./deploy/compose/grafana/dashboards:{path}:ro" in grafana["volumes"]
    assert (
        "./deploy/compose/grafana/provisioning:/etc/grafana/provisioning:ro" in grafana["volumes"]
    )
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home.startswith(path + "/")
    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / Path(home).name).read_text())
    assert dashboard["uid"] == "draftgate"
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    targets = [t for p in dashboard["panels"] for t in p.get("targets", [])]
    assert targets
    assert {t["datasource"]["uid"] for t in targets} == {datasource["uid"]}


def grafana_metric_names() -> set[str]:
    """Every metric name the Grafana dashboard's queries use."""
    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "draftgate.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    return {name for e in exprs for name in re.findall(r"\b(?:draftgate_|vllm:)[a-z_:]+", e)}


def test_grafana_shows_gateway_and_spec_decode_panels() -> None:
    names = grafana_metric_names()
    assert {
        "vllm:spec_decode_num_accepted_tokens_total",
        "vllm:spec_decode_num_drafts_total",
        "vllm:spec_decode_num_accepted_tokens_per_pos_total",
        "vllm:generation_tokens_total",
        "draftgate_requests_total",
        "draftgate_request_latency_seconds_bucket",
    } <= names
    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "draftgate.json").read_text())
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p.get("targets", []))
    # Acceptance length is vLLM's 1 + accepted / drafts, per backend (the relabelled DNS name).
    assert (
        "1 + sum by (backend) (rate(vllm:spec_decode_num_accepted_tokens_total[$__rate_interval]))"
        " / sum by (backend) (rate(vllm:spec_decode_num_drafts_total[$__rate_interval]))"
    ) in exprs
    jobs = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())["scrape_configs"]
    for job in jobs:
        if job["job_name"].startswith("vllm-"):
            assert {"source_labels": ["__meta_dns_name"], "target_label": "backend"} in job[
                "relabel_configs"
            ]


def test_grafana_draws_every_figure_an_alert_reads_and_the_alerts_firing() -> None:
    names = grafana_metric_names()
    read = set().union(*(metric_names(rule["expr"]) for rule in alerting_rules()))
    assert read - {"up"} <= names, read - names
    drawn = {n for n in names if n.startswith("draftgate_")}
    assert drawn <= exported_metric_names(), drawn - exported_metric_names()
    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "draftgate.json").read_text())
    [alerts] = [p for p in dashboard["panels"] if p["title"] == "Alerts firing"]
    assert [t["expr"] for t in alerts["targets"]] == [
        'ALERTS{alertstate="firing", alertname=~"Draftgate.*"}'
    ]
    panels = sorted(dashboard["panels"], key=lambda p: (p["gridPos"]["y"], p["gridPos"]["x"]))
    assert panels[0]["type"] == "row"
    assert panels[1] is alerts  # the first thing one sees


# --- the image ---


def _dockerfile_instructions() -> list[tuple[str, str]]:
    """(KEYWORD, arguments) of each Dockerfile instruction, continuation lines joined."""
    text = DOCKERFILE.read_text(encoding="utf-8").replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines()]
    pairs = [line.split(maxsplit=1) for line in lines if line and not line.startswith("#")]
    return [(keyword.upper(), args) for keyword, args in pairs]


def test_dockerfile_runs_gateway_as_non_root_with_healthcheck() -> None:
    instructions = _dockerfile_instructions()
    last = dict(instructions)  # the final stage's value wins, as in Docker
    assert instructions[0] == ("FROM", "python:3.11-slim AS build")
    assert [args for keyword, args in instructions if keyword == "FROM"][-1] == "python:3.11-slim"
    assert last["USER"] not in {"root", "0"}
    assert last["EXPOSE"] == "8080"
    assert last["CMD"] == '["draftgate", "gateway", "--host", "0.0.0.0"]'
    assert "/health" in last["HEALTHCHECK"]
    assert "urllib" in last["HEALTHCHECK"]


def test_the_build_stage_copies_every_package_the_project_builds() -> None:
    """The build stage copies each package setuptools finds, pyproject.toml and the readme;
    .dockerignore keeps none of them out."""
    copies = [args.split() for keyword, args in _dockerfile_instructions() if keyword == "COPY"]
    sources = {src for args in copies if not args[0].startswith("--from") for src in args[:-1]}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    include = project["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = setuptools.find_namespace_packages(str(ROOT), include=include)
    assert {"gateway", "planner", "backends", "dashboard", "migrations"} <= set(packages)
    assert {p.split(".")[0] for p in packages} | {
        "pyproject.toml",
        project["project"]["readme"],
    } == sources
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()}
    assert not sources & ignored


def test_kubernetes_vllm_manifests_pin_the_rendered_image() -> None:
    manifests = sorted((DEPLOY.parent / "k8s" / "base").glob("vllm-*.yaml"))
    assert len(manifests) == 5
    for path in manifests:
        images = {
            container["image"]
            for doc in yaml.safe_load_all(path.read_text(encoding="utf-8"))
            if doc and doc.get("kind") == "Deployment"
            for container in doc["spec"]["template"]["spec"]["containers"]
        }
        assert images == {VLLM_IMAGE}, path.name
