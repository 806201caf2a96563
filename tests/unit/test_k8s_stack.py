"""deploy/k8s's stack, checked offline: the gateway's settings in its pod, secrets, the
dashboard, and each backend's command against its fleet.yaml entry and backends/methods.py."""

from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from pydantic import ValidationError

from backends.methods import make_spec, render_speculative_config, render_vllm_args
from gateway.services.fleet import Fleet, load_fleet
from gateway.settings import Settings
from tests.unit.k8s_queries import (
    ALL_INTERFACES,
    BASE,
    DRAFTERS,
    GPU,
    K8S,
    MODEL,
    SIM,
    backend_deployment,
    env_value,
    fleet,
    only_container,
    parse_draftgate,
    port_number,
    probes,
    secret_value,
)
from tests.unit.kustomize_build import Build, build


@pytest.fixture(scope="module")
def base() -> Build:
    return build(BASE)


@pytest.fixture(scope="module")
def sim() -> Build:
    return build(SIM)


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
    # What `draftgate gateway` would run with: its flags over the pod's environment.
    params = parse_draftgate(container["command"])
    settings = Settings(**{k: v for k, v in params.items() if v is not None})
    assert (settings.host, settings.port) == (ALL_INTERFACES, port)
    assert settings.database_url.startswith("postgresql+psycopg://")
    assert settings.fleet is not None
    assert fleet(base).backends, "DRAFTGATE_FLEET names the mounted ConfigMap's fleet.yaml"


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
    token = env_value(container, "DRAFTGATE_ADMIN_TOKEN")["valueFrom"]["secretKeyRef"]
    assert token == {"name": "draftgate-secrets", "key": "admin-token"}


# --- the fleet and its backends -----------------------------------------------------------


def test_fleet_loads_with_the_gateways_loader(base: Build, tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(base.named("ConfigMap", "draftgate-fleet")["data"]["fleet.yaml"])
    loaded = load_fleet(path)
    assert loaded == fleet(base)
    assert {b.method: b.drafter for b in loaded.backends} == DRAFTERS
    assert {b.model for b in loaded.backends} == {m.name for m in loaded.models} == {MODEL}
    assert {p.gpu_type for p in loaded.prices} == {b.gpu_type for b in loaded.backends}


@pytest.mark.parametrize("method", list(DRAFTERS))
def test_each_vllm_backend_serves_its_fleet_entry(base: Build, method: str) -> None:
    [backend] = [b for b in fleet(base).backends if b.method == method]
    service, deployment = backend_deployment(base, backend.normalised_url())
    container = only_container(deployment)
    port = port_number(container, service["spec"]["ports"][0]["targetPort"])
    spec = make_spec(method, backend.k, DRAFTERS[method])
    assert backend.method_spec() == spec
    assert container["command"] == render_vllm_args(MODEL, spec, host=ALL_INTERFACES, port=port)
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
    assert "persistentVolumeClaim" in volume


@pytest.mark.parametrize("method", list(DRAFTERS))
def test_sim_overlay_simulates_each_fleet_entry_without_gpus(sim: Build, method: str) -> None:
    [backend] = [b for b in fleet(sim).backends if b.method == method]
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
    def methods(loaded: Fleet) -> set[tuple[object, ...]]:
        return {
            (b.model, b.method, b.k, b.drafter, b.gpu_type, b.gpu_count) for b in loaded.backends
        }

    assert methods(fleet(base)) == methods(load_fleet(COMPOSE_GPU_FLEET))
