"""deploy/k8s's stack, checked offline: the gateway's settings in its pod, secrets, the
read-only dashboard and, in overlays/login, the admin one behind oauth2-proxy, and each
backend's command against its fleet.yaml entry and backends/methods.py."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from pydantic import ValidationError

from backends.methods import make_spec, render_speculative_config, render_vllm_args
from dashboard.server import HEALTH_PATH, host_allowed
from dashboard.settings import DashboardSettings
from gateway.services.fleet import Fleet, load_fleet
from gateway.settings import Settings
from tests.unit.k8s_queries import (
    ALL_INTERFACES,
    BASE,
    DRAFTERS,
    GPU,
    K8S,
    LOGIN,
    MODEL,
    NAMESPACE,
    OAUTH2_PROXY_COOKIE_SECRET_BYTES,
    OAUTH2_PROXY_PING,
    OAUTH2_PROXY_REQUIRED,
    SIM,
    backend_deployment,
    env_value,
    fleet,
    oauth2_proxy_options,
    only_container,
    parse_draftgate,
    pool_backends,
    port_number,
    probes,
    resolved_env,
    secret_value,
    selected_workloads,
)
from tests.unit.kustomize_build import Build, Manifest, build


@pytest.fixture(scope="module")
def base() -> Build:
    return build(BASE)


@pytest.fixture(scope="module")
def sim() -> Build:
    return build(SIM)


@pytest.fixture(scope="module")
def login() -> Build:
    return build(LOGIN)


def test_gateway_runs_replicated_and_ready_on_its_settings_port(
    base: Build, monkeypatch: pytest.MonkeyPatch
) -> None:
    deployment = base.named("Deployment", "draftgate-gateway")
    container = only_container(deployment)
    assert deployment["spec"]["replicas"] > 1
    checks = {kind: probe["httpGet"] for kind, probe in probes(container).items()}
    assert checks["readinessProbe"]["path"] == "/ready"
    assert checks["livenessProbe"]["path"] == "/health"
    port = port_number(container, checks["readinessProbe"]["port"])
    assert port == Settings.model_fields["port"].default == 8080
    service = base.named("Service", "draftgate-gateway")
    assert [port_number(container, p["targetPort"]) for p in service["spec"]["ports"]] == [port]

    for name in [n for n in os.environ if n.startswith("DRAFTGATE_")]:
        monkeypatch.delenv(name)
    for entry in container["env"]:
        ref = entry.get("valueFrom", {}).get("secretKeyRef")
        value = secret_value(base, ref["name"], ref["key"]) if ref else entry["value"]
        monkeypatch.setenv(entry["name"], value)
    monkeypatch.setenv("DRAFTGATE_ADMIN_TOKEN", "a-real-token-of-32-characters-xx")
    monkeypatch.setenv("DRAFTGATE_ADMIN_READ_TOKEN", "a-real-read-token-of-32-chars-xx")
    # What `draftgate gateway` would run with: its flags over the pod's environment.
    params = parse_draftgate(container["command"])
    settings = Settings(**{k: v for k, v in params.items() if v is not None})
    assert (settings.host, settings.port) == (ALL_INTERFACES, port)
    assert settings.admin_token is not None
    assert settings.admin_read_token is not None
    read = env_value(container, "DRAFTGATE_ADMIN_READ_TOKEN")["valueFrom"]["secretKeyRef"]
    assert read == {"name": "draftgate-secrets", "key": "admin-read-token"}
    assert settings.database_url.startswith("postgresql+psycopg://")
    assert settings.fleet is not None
    assert fleet(base).pools, "DRAFTGATE_FLEET names the mounted ConfigMap's fleet.yaml"


def test_gateway_pods_get_time_to_finish_streams_before_they_are_killed(base: Build) -> None:
    deployment = base.named("Deployment", "draftgate-gateway")
    container = only_container(deployment)
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    grace_s = int(env_value(container, "DRAFTGATE_SHUTDOWN_GRACE_S")["value"])
    flush_s = 10  # the ledger's last write after the streams end
    budget_s = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert int(pre_stop[1]) + grace_s + flush_s <= budget_s


def test_secret_placeholders_are_refused_and_agree_with_postgres(base: Build) -> None:
    token = secret_value(base, "draftgate-secrets", "admin-token")
    with pytest.raises(ValidationError, match="placeholder or shorter"):
        Settings(admin_token=token)
    read = secret_value(base, "draftgate-secrets", "admin-read-token")
    with pytest.raises(ValidationError, match="ADMIN_READ_TOKEN is empty, a placeholder"):
        Settings(admin_token="a-real-token-of-32-characters-xx", admin_read_token=read)
    url = urlsplit(secret_value(base, "draftgate-secrets", "database-url"))
    postgres = only_container(base.named("StatefulSet", "postgres"))
    service = base.named("Service", "postgres")
    assert (url.hostname, url.port) == (
        service["metadata"]["name"],
        service["spec"]["ports"][0]["port"],
    )
    assert url.username == env_value(postgres, "POSTGRES_USER")["value"]
    assert url.path == "/" + env_value(postgres, "POSTGRES_DB")["value"]
    ref = env_value(postgres, "POSTGRES_PASSWORD")["valueFrom"]["secretKeyRef"]
    assert url.password == secret_value(base, ref["name"], ref["key"])


def test_dashboard_reads_the_gateway_service_on_its_default_port(base: Build) -> None:
    container = only_container(base.named("Deployment", "draftgate-dashboard"))
    params = parse_draftgate(container["command"])
    default_port = parse_draftgate(["draftgate", "dashboard"])["port"]
    assert params["port"] == default_port == 8501
    assert params["host"] == ALL_INTERFACES
    assert port_number(container, container["readinessProbe"]["httpGet"]["port"]) == 8501
    url = urlsplit(env_value(container, "DRAFTGATE_DASHBOARD_GATEWAY_URL")["value"])
    gateway = base.named("Service", str(url.hostname))
    assert [p["port"] for p in gateway["spec"]["ports"]] == [url.port]
    assert gateway["spec"]["selector"]["app.kubernetes.io/component"] == "gateway"


def _dashboard_settings(
    result: Build, container: Manifest, monkeypatch: pytest.MonkeyPatch
) -> DashboardSettings:
    """The dashboard's settings as its pod gives them: its environment, and `--admin`."""
    for name in [n for n in os.environ if n.startswith("DRAFTGATE_")]:
        monkeypatch.delenv(name)
    for name, value in resolved_env(result, container).items():
        monkeypatch.setenv(name, value)
    if parse_draftgate(container["command"])["admin"]:
        monkeypatch.setenv("DRAFTGATE_DASHBOARD_ADMIN", "true")  # what the flag does
    return DashboardSettings()


def test_base_dashboard_is_read_only_and_answers_its_own_names(
    base: Build, monkeypatch: pytest.MonkeyPatch
) -> None:
    container = only_container(base.named("Deployment", "draftgate-dashboard"))
    assert parse_draftgate(container["command"])["admin"] is False
    names = {e["name"] for e in container["env"]}
    assert "DRAFTGATE_ADMIN_TOKEN" not in names  # no change is possible from its pages
    token = env_value(container, "DRAFTGATE_ADMIN_READ_TOKEN")["valueFrom"]["secretKeyRef"]
    assert token == {"name": "draftgate-secrets", "key": "admin-read-token"}
    settings = _dashboard_settings(base, container, monkeypatch)
    assert settings.dashboard_admin is False
    assert settings.admin_token is None
    assert settings.admin_read_token is not None
    # `kubectl port-forward` (Host localhost) and its Service's names, in-cluster; no other.
    service = base.named("Service", "draftgate-dashboard")["metadata"]["name"]
    for host in ("localhost:8501", service, f"{service}.{NAMESPACE}.svc:8501"):
        assert host_allowed(host, settings.allowed_hosts), host
    for host in ("dashboard.example.com", "10.0.0.7:8501", f"{service}.evil.example"):
        assert not host_allowed(host, settings.allowed_hosts), host
    # The kubelet's probes carry the pod's IP as Host: they ask the path always answered.
    assert {p["httpGet"]["path"] for p in probes(container).values()} == {HEALTH_PATH}


def test_login_dashboard_acts_as_admin_for_the_host_users_sign_in_at(
    login: Build, monkeypatch: pytest.MonkeyPatch
) -> None:
    container = only_container(login.named("Deployment", "draftgate-dashboard"))
    assert parse_draftgate(container["command"])["admin"] is True
    token = env_value(container, "DRAFTGATE_ADMIN_TOKEN")["valueFrom"]["secretKeyRef"]
    assert token == {"name": "draftgate-secrets", "key": "admin-token"}
    settings = _dashboard_settings(login, container, monkeypatch)
    assert settings.dashboard_admin is True
    assert settings.admin_token is not None
    # oauth2-proxy passes the browser's Host through: the redirect URL's host.
    proxy = only_container(login.named("Deployment", "oauth2-proxy"))
    options = oauth2_proxy_options(proxy.get("args", []), resolved_env(login, proxy))
    public = urlsplit(options["redirect_url"])
    assert (public.scheme, public.path) == ("https", "/oauth2/callback")
    assert host_allowed(public.netloc, settings.allowed_hosts)
    assert host_allowed("localhost:8501", settings.allowed_hosts)  # kubectl port-forward
    assert not host_allowed("draftgate-dashboard", settings.allowed_hosts)


def test_oauth2_proxy_signs_users_in_and_forwards_them_to_the_dashboard(login: Build) -> None:
    deployment = login.named("Deployment", "oauth2-proxy")
    container = only_container(deployment)
    repository, _, tag = container["image"].rpartition(":")
    assert repository == "quay.io/oauth2-proxy/oauth2-proxy"
    assert re.fullmatch(r"v\d+\.\d+\.\d+", tag), "pin the image to a release"
    options = oauth2_proxy_options(container.get("args", []), resolved_env(login, container))
    assert options.keys() >= OAUTH2_PROXY_REQUIRED, OAUTH2_PROXY_REQUIRED - options.keys()
    assert options["provider"] == "oidc"
    assert urlsplit(options["oidc_issuer_url"]).scheme == "https"
    # The dashboard needs the browser's Host (its allow-list) and its WebSocket.
    assert options.get("pass_host_header", "true") == "true"
    assert options.get("proxy_websockets", "true") == "true"
    # It listens on every interface of the pod, on the port its Service and probes name.
    host, _, listen = options["http_address"].rpartition(":")
    assert host == ALL_INTERFACES
    service = login.named("Service", "oauth2-proxy")
    assert selected_workloads(login, {"matchLabels": service["spec"]["selector"]}) == [deployment]
    assert [port_number(container, p["targetPort"]) for p in service["spec"]["ports"]] == [
        int(listen)
    ]
    for probe in probes(container).values():
        assert probe["httpGet"]["path"] == OAUTH2_PROXY_PING
        assert port_number(container, probe["httpGet"]["port"]) == int(listen)
    assert {"readinessProbe", "livenessProbe"} <= probes(container).keys()
    # Its one upstream is the dashboard's Service, on the port the dashboard listens on.
    upstream = urlsplit(options["upstreams"])
    target = login.named("Service", str(upstream.hostname))
    [dashboard] = selected_workloads(login, {"matchLabels": target["spec"]["selector"]})
    assert dashboard["metadata"]["name"] == "draftgate-dashboard"
    [mapped] = [p for p in target["spec"]["ports"] if p["port"] == upstream.port]
    dashboard_port = parse_draftgate(only_container(dashboard)["command"])["port"]
    assert port_number(only_container(dashboard), mapped["targetPort"]) == dashboard_port
    # Its secrets are placeholders it refuses (no cookie secret of an AES key's size).
    for key in ("client-id", "client-secret", "cookie-secret"):
        assert secret_value(login, "oauth2-proxy", key) == "REPLACE-ME"
    cookie = secret_value(login, "oauth2-proxy", "cookie-secret")
    assert len(cookie.encode()) not in OAUTH2_PROXY_COOKIE_SECRET_BYTES
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]


# --- the fleet and its backends -----------------------------------------------------------


def test_fleet_loads_with_the_gateways_loader(base: Build, tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(base.named("ConfigMap", "draftgate-fleet")["data"]["fleet.yaml"])
    loaded = load_fleet(path)
    assert loaded == fleet(base)
    backends = pool_backends(loaded)
    assert loaded.backends == []  # every method a pool of pods
    assert {b.method: b.drafter for b in backends} == DRAFTERS
    assert {b.model for b in backends} == {m.name for m in loaded.models} == {MODEL}
    assert {p.gpu_type for p in loaded.prices} == {b.gpu_type for b in backends}


@pytest.mark.parametrize("method", list(DRAFTERS))
def test_each_vllm_backend_serves_its_fleet_entry(base: Build, method: str) -> None:
    [backend] = [b for b in pool_backends(fleet(base)) if b.method == method]
    service, deployment = backend_deployment(base, backend.normalised_url())
    assert service["spec"]["clusterIP"] == "None"  # headless: one address per ready pod
    container = only_container(deployment)
    port = port_number(container, service["spec"]["ports"][0]["targetPort"])
    spec = make_spec(method, backend.k, DRAFTERS[method])
    assert backend.method_spec() == spec
    assert backend.scheduling == "priority"
    assert container["command"] == render_vllm_args(
        MODEL, spec, host=ALL_INTERFACES, port=port, scheduling=backend.scheduling
    )
    rendered = render_speculative_config(spec)
    if rendered is None:
        assert "--speculative-config" not in container["command"]
    else:
        flag = container["command"].index("--speculative-config")
        assert json.loads(container["command"][flag + 1]) == rendered
        assert rendered["model"] == DRAFTERS[method]
        assert rendered["num_speculative_tokens"] == backend.k
    assert container["image"].startswith("vllm/vllm-openai:")
    resources = container["resources"]
    assert resources["requests"][GPU] == resources["limits"][GPU] == backend.gpu_count
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert env_value(container, "HF_TOKEN")["valueFrom"]["secretKeyRef"]["name"] == "hf-token"
    cache = env_value(container, "HF_HOME")["value"]
    [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == cache]
    pod = deployment["spec"]["template"]["spec"]
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert "ephemeral" in volume  # a cache per pod: the pool scales past one pod, any node
    assert deployment["spec"].get("strategy", {}).get("type") != "Recreate"


@pytest.mark.parametrize("method", list(DRAFTERS))
def test_sim_overlay_simulates_each_fleet_entry_without_gpus(sim: Build, method: str) -> None:
    [backend] = [b for b in pool_backends(fleet(sim)) if b.method == method]
    service, deployment = backend_deployment(sim, backend.normalised_url())
    container = only_container(deployment)
    params = parse_draftgate(container["command"])
    assert (params["model"], params["method"], params["k"]) == (MODEL, method, backend.k)
    assert (params["gpu"], params["gpu_count"]) == (backend.gpu_type, backend.gpu_count)
    assert params["host"] == ALL_INTERFACES
    assert params["port"] == port_number(container, service["spec"]["ports"][0]["targetPort"])
    assert params["port"] == port_number(container, container["readinessProbe"]["httpGet"]["port"])


def test_sim_overlay_asks_for_no_gpu_and_no_model_cache(base: Build, sim: Build) -> None:
    assert GPU in json.dumps(base.objects)
    assert GPU not in json.dumps(sim.objects)
    assert sim.of_kind("PersistentVolumeClaim") == []
    assert fleet(sim) == fleet(base)


COMPOSE_GPU_FLEET = K8S.parent / "compose" / "fleet-gpu.yaml"


def test_kubernetes_and_compose_serve_the_same_gpu_fleet(base: Build) -> None:
    """The same methods; compose's are one server each (static URLs), Kubernetes' pools."""

    def methods(loaded: Fleet) -> set[tuple[object, ...]]:
        return {
            (b.model, b.method, b.k, b.drafter, b.gpu_type, b.gpu_count)
            for b in [*loaded.backends, *pool_backends(loaded)]
        }

    assert methods(fleet(base)) == methods(load_fleet(COMPOSE_GPU_FLEET))
