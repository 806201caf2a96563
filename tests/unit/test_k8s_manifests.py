"""deploy/k8s, checked offline: Kubernetes schemas, kustomize resolution, names and ports,
draftgate commands, and vLLM arguments rendered exactly as backends/methods.py does."""

from __future__ import annotations

import base64
import copy
import json
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import typer.main
import yaml
from kubernetes_validate.utils import SchemaNotFoundError  # type: ignore[import-untyped]
from pydantic import ValidationError
from typer.core import TyperGroup
from typer.exceptions import TyperException

from backends.methods import make_spec, render_speculative_config, render_vllm_args
from gateway import cli
from gateway.fleet import Fleet, load_fleet
from gateway.settings import Settings
from tests.unit.kustomize_build import Build, KustomizeError, Manifest, build

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
DOCKERFILE = ROOT / "Dockerfile"
BASE = K8S / "base"
SIM = K8S / "overlays" / "sim"
MODEL = "Qwen/Qwen3-8B"
# The published Qwen3-8B drafter of each method the GPU fleet serves.
DRAFTERS = {
    "plain": None,
    "eagle3": "RedHatAI/Qwen3-8B-speculator.eagle3",
    "p-eagle": "RedHatAI/Qwen3-8B-speculator.peagle",
    "dflash": "z-lab/Qwen3-8B-DFlash-b16",
    "dspark": "deepseek-ai/dspark_qwen3_8b_block7",
}
# The oldest Kubernetes release still commonly run, and the newest the validator knows.
K8S_VERSIONS = ("1.30", kubernetes_validate.latest_version())
WORKLOAD_KINDS = ("Deployment", "StatefulSet", "Job")
GPU = "nvidia.com/gpu"
# Pods are reached on their pod IP, so every server in them listens on all interfaces.
ALL_INTERFACES = "0.0.0.0"  # noqa: S104


@pytest.fixture(scope="module")
def base() -> Build:
    return build(BASE)


@pytest.fixture(scope="module")
def sim() -> Build:
    return build(SIM)


@pytest.fixture(scope="module", params=[BASE, SIM], ids=["base", "sim"])
def any_build(request: pytest.FixtureRequest) -> Build:
    return build(request.param)


def pod_specs(result: Build) -> Iterator[tuple[str, Manifest]]:
    for kind in WORKLOAD_KINDS:
        for obj in result.of_kind(kind):
            yield f"{kind}/{obj['metadata']['name']}", obj["spec"]["template"]["spec"]


def containers(pod: Manifest) -> list[Manifest]:
    return [*pod.get("initContainers", []), *pod["containers"]]


def only_container(obj: Manifest) -> Manifest:
    found: list[Manifest] = obj["spec"]["template"]["spec"]["containers"]
    assert len(found) == 1, obj["metadata"]["name"]
    return found[0]


def port_number(container: Manifest, port: int | str) -> int:
    """A container port given by number or by name; fails when the container lacks it."""
    for declared in container.get("ports", []):
        if port in (declared["containerPort"], declared.get("name")):
            number: int = declared["containerPort"]
            return number
    raise AssertionError(f"container {container['name']} declares no port {port!r}")


def env_value(container: Manifest, name: str) -> Manifest:
    found: list[Manifest] = [e for e in container.get("env", []) if e["name"] == name]
    assert len(found) == 1, f"{container['name']}: {name} set {len(found)} times"
    return found[0]


def probes(container: Manifest) -> dict[str, Manifest]:
    return {kind: container[kind] for kind in ("startupProbe", "livenessProbe",
            "readinessProbe") if kind in container}  # fmt: skip


def secret_value(result: Build, name: str, key: str) -> str:
    encoded = result.named("Secret", name)["data"][key]
    return base64.b64decode(encoded).decode()


def parse_draftgate(argv: list[str]) -> dict[str, Any]:
    """The parameters a `draftgate ...` argv gives its command, parsed by the real command
    tree without running it; TyperException (click's errors) when draftgate would refuse it."""
    assert argv[0] == "draftgate", argv
    command = typer.main.get_command(cli.app)
    name, args, parent = "draftgate", argv[1:], None
    while isinstance(command, TyperGroup) and args and not args[0].startswith("-"):
        parent = command.make_context(name, [], parent=parent, resilient_parsing=True)
        word = args[0]
        resolved, sub, args = command.resolve_command(parent, args)
        if resolved is None or sub is None:
            raise typer.BadParameter(f"no such command {word!r}")
        name, command = resolved, sub
    ctx = command.make_context(name, list(args), parent=parent)
    # A group that also runs without a sub-command keeps unparsed words for one.
    left = [*getattr(ctx, "_protected_args", []), *ctx.args]
    if left:
        raise typer.BadParameter(f"unexpected arguments {left}")
    return dict(ctx.params)


def draftgate_commands(result: Build) -> list[tuple[str, list[str]]]:
    return [
        (where, container["command"] + container.get("args", []))
        for where, pod in pod_specs(result)
        for container in containers(pod)
        if container.get("command", [""])[0] == "draftgate"
    ]


def fleet(result: Build) -> Fleet:
    """The fleet.yaml every gateway pod reads: the ConfigMap's copy, loaded by the gateway."""
    deployment = result.named("Deployment", "draftgate-gateway")
    container = only_container(deployment)
    path = Path(env_value(container, "DRAFTGATE_FLEET")["value"])
    [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == str(path.parent)]
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    [volume] = [v for v in volumes if v["name"] == mount["name"]]
    text = result.named("ConfigMap", volume["configMap"]["name"])["data"][path.name]
    return Fleet.model_validate(yaml.safe_load(text))


def backend_deployment(result: Build, url: str) -> tuple[Manifest, Manifest]:
    """The Service a backend URL names (`http://service:port`) and the Deployment behind it."""
    parts = urlsplit(url)
    service = result.named("Service", str(parts.hostname))
    assert [p["port"] for p in service["spec"]["ports"]] == [parts.port], url
    selector = service["spec"]["selector"]
    [deployment] = [
        d for d in result.of_kind("Deployment")
        if selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
    ]  # fmt: skip
    return service, deployment


# --- schemas and resolution --------------------------------------------------------------


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_object_validates_against_the_kubernetes_schemas(
    any_build: Build, version: str
) -> None:
    assert len(any_build.objects) > 15
    for obj in any_build.objects:
        kubernetes_validate.validate(obj, version, strict=True)


def test_the_schema_check_rejects_broken_manifests(base: Build) -> None:
    gateway = base.named("Deployment", "draftgate-gateway")
    version = K8S_VERSIONS[-1]
    kubernetes_validate.validate(gateway, version, strict=True)
    wrong_type = copy.deepcopy(gateway)
    wrong_type["spec"]["replicas"] = "two"
    unknown_field = copy.deepcopy(gateway)
    unknown_field["spec"]["template"]["spec"]["containers"][0]["healthcheck"] = {"test": "x"}
    no_image_name = copy.deepcopy(gateway)
    del no_image_name["spec"]["template"]["spec"]["containers"][0]["name"]
    for broken in (wrong_type, unknown_field, no_image_name):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, version, strict=True)
    with pytest.raises(SchemaNotFoundError):
        kubernetes_validate.validate({**gateway, "kind": "Deploymnet"}, version, strict=True)


def test_every_file_in_the_tree_is_read_by_a_kustomization(base: Build, sim: Build) -> None:
    on_disk = {p.resolve() for p in K8S.rglob("*") if p.is_file() and p.name != "README.md"}
    assert on_disk == base.files | sim.files


def test_a_missing_resource_or_unknown_feature_is_refused(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("resources: [absent.yaml]\n")
    with pytest.raises(KustomizeError, match=r"absent\.yaml"):
        build(tmp_path)
    (tmp_path / "kustomization.yaml").write_text("images: [{name: draftgate, newTag: v1}]\n")
    with pytest.raises(KustomizeError, match="images"):
        build(tmp_path)


def _comparable(objects: list[Manifest], hashed: dict[str, str]) -> list[Manifest]:
    """Objects with kustomize's hashed names mapped back, Secret data decoded, sorted."""

    def unhash(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: unhash(v) for k, v in value.items()}
        if isinstance(value, list):
            return [unhash(v) for v in value]
        return hashed.get(value, value) if isinstance(value, str) else value

    result = [unhash(obj) for obj in objects]
    for obj in result:
        if obj["kind"] == "Secret":
            obj["data"] = {k: base64.b64decode(v).decode() for k, v in obj["data"].items()}
    return sorted(result, key=lambda o: (o["kind"], o["metadata"]["name"]))


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (with kustomize) absent")
@pytest.mark.parametrize("directory", [BASE, SIM], ids=["base", "sim"])
def test_resolution_matches_kubectl_kustomize(directory: Path) -> None:
    ours = build(directory)
    out = subprocess.run(
        ["kubectl", "kustomize", str(directory)],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    theirs = [doc for doc in yaml.safe_load_all(out) if doc]
    hashed = {}
    for obj in theirs:
        name = obj["metadata"]["name"]
        stem, _, suffix = name.rpartition("-")
        if (obj["kind"], stem) in ours.generated and len(suffix) == 10:
            hashed[name] = stem
    assert len(hashed) == len(ours.generated)
    assert _comparable(theirs, hashed) == _comparable(ours.objects, {})


# --- names, labels, ports and references -------------------------------------------------


def test_each_service_selects_one_workload_and_targets_its_port(any_build: Build) -> None:
    services = any_build.of_kind("Service")
    assert len(services) == 8  # gateway, dashboard, postgres, five backends
    for service in services:
        selector = service["spec"]["selector"]
        workloads = [
            w for kind in ("Deployment", "StatefulSet") for w in any_build.of_kind(kind)
            if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()
        ]  # fmt: skip
        assert len(workloads) == 1, f"Service {service['metadata']['name']} selects {workloads}"
        container = only_container(workloads[0])
        for port in service["spec"]["ports"]:
            port_number(container, port["targetPort"])


def test_workload_and_budget_selectors_match_their_pods(any_build: Build) -> None:
    for kind in ("Deployment", "StatefulSet"):
        for obj in any_build.of_kind(kind):
            labels = obj["spec"]["template"]["metadata"]["labels"]
            assert obj["spec"]["selector"]["matchLabels"].items() <= labels.items()
    [budget] = any_build.of_kind("PodDisruptionBudget")
    gateway = any_build.named("Deployment", "draftgate-gateway")
    assert budget["spec"]["minAvailable"] < gateway["spec"]["replicas"]
    pod_labels = gateway["spec"]["template"]["metadata"]["labels"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


def test_every_probe_uses_a_declared_port(any_build: Build) -> None:
    checked = 0
    for _, pod in pod_specs(any_build):
        for container in containers(pod):
            for probe in probes(container).values():
                if "httpGet" in probe:
                    port_number(container, probe["httpGet"]["port"])
                    checked += 1
    assert checked >= 3 + 7  # gateway and dashboard probes, then one or more per backend


def test_every_secret_configmap_claim_and_volume_reference_resolves(any_build: Build) -> None:
    secrets = {s["metadata"]["name"]: s["data"] for s in any_build.of_kind("Secret")}
    maps = {c["metadata"]["name"] for c in any_build.of_kind("ConfigMap")}
    claims = {c["metadata"]["name"] for c in any_build.of_kind("PersistentVolumeClaim")}
    for where, pod in pod_specs(any_build):
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        templates = {t["metadata"]["name"] for w in any_build.of_kind("StatefulSet")
                     for t in w["spec"].get("volumeClaimTemplates", [])}  # fmt: skip
        for volume in volumes.values():
            if "configMap" in volume:
                assert volume["configMap"]["name"] in maps, where
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] in claims, where
        for container in containers(pod):
            for mount in container.get("volumeMounts", []):
                assert mount["name"] in volumes.keys() | templates, f"{where}: {mount}"
            for entry in container.get("env", []):
                ref = entry.get("valueFrom", {}).get("secretKeyRef")
                if ref and not ref.get("optional"):
                    assert ref["key"] in secrets.get(ref["name"], {}), f"{where}: {ref}"
    for statefulset in any_build.of_kind("StatefulSet"):
        any_build.named("Service", statefulset["spec"]["serviceName"])


# --- draftgate commands and settings ------------------------------------------------------


def test_every_draftgate_command_is_a_real_subcommand_with_valid_flags(
    base: Build, sim: Build
) -> None:
    commands = draftgate_commands(base) + draftgate_commands(sim)
    assert len(commands) == 3 + 3 + 5  # gateway, dashboard, migrate twice; five simulators
    for where, argv in commands:
        try:
            parse_draftgate(argv)
        except TyperException as exc:
            pytest.fail(f"{where}: {argv}: {exc}")


@pytest.mark.parametrize(
    "argv",
    [
        ["draftgate", "gateway", "--listen", ALL_INTERFACES],
        ["draftgate", "gatewy"],
        ["draftgate", "db", "upgrad"],
        ["draftgate", "sim", "--model", MODEL, "--k", "three"],
        ["draftgate", "dashboard", "--port", "0"],
        ["draftgate", "sim", "--model", MODEL, "extra"],
    ],
)
def test_the_command_check_rejects_what_draftgate_would(argv: list[str]) -> None:
    with pytest.raises(TyperException):
        parse_draftgate(argv)


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


@pytest.mark.skipif("shutdown_grace_s" not in Settings.model_fields, reason="no shutdown grace")
def test_gateway_pods_get_time_to_finish_streams_before_they_are_killed(base: Build) -> None:
    deployment = base.named("Deployment", "draftgate-gateway")
    container = only_container(deployment)
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    grace_s = int(env_value(container, "DRAFTGATE_SHUTDOWN_GRACE_S")["value"])
    flush_s = 10  # the ledger's last write after the streams end
    budget_s = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert int(pre_stop[1]) + grace_s + flush_s <= budget_s


def test_every_draftgate_pod_runs_as_non_root_with_resources(any_build: Build) -> None:
    # The image's user (Dockerfile: useradd ... --home-dir HOME --uid UID).
    useradd = re.search(r"--home-dir (\S+) --uid (\d+)", DOCKERFILE.read_text(encoding="utf-8"))
    assert useradd is not None
    home, uid = useradd[1], int(useradd[2])
    for where, pod in pod_specs(any_build):
        for container in containers(pod):
            assert {"requests", "limits"} <= container["resources"].keys(), where
            assert container["securityContext"]["allowPrivilegeEscalation"] is False, where
            if container["image"].startswith("draftgate:"):
                assert pod["securityContext"]["runAsNonRoot"] is True, where
                assert pod["securityContext"]["runAsUser"] == uid != 0, where
                assert container["securityContext"]["readOnlyRootFilesystem"] is True, where
    # Streamlit writes under $HOME: the dashboard gets a writable volume there.
    dashboard = only_container(any_build.named("Deployment", "draftgate-dashboard"))
    assert home in {m["mountPath"] for m in dashboard["volumeMounts"]}


def test_secret_placeholders_are_refused_and_agree_with_postgres(base: Build) -> None:
    token = secret_value(base, "draftgate-secrets", "admin-token")
    with pytest.raises(ValidationError, match="placeholder or shorter"):
        Settings(admin_token=token)
    url = urlsplit(secret_value(base, "draftgate-secrets", "database-url"))
    postgres = only_container(base.named("StatefulSet", "postgres"))
    service = base.named("Service", "postgres")
    assert (url.hostname, url.port) == (service["metadata"]["name"],
                                        service["spec"]["ports"][0]["port"])  # fmt: skip
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


@pytest.mark.skipif(not COMPOSE_GPU_FLEET.exists(), reason="no compose gpu profile fleet")
def test_kubernetes_and_compose_serve_the_same_gpu_fleet(base: Build) -> None:
    def methods(loaded: Fleet) -> set[tuple[object, ...]]:
        return {(b.model, b.method, b.k, b.drafter, b.gpu_type, b.gpu_count)
                for b in loaded.backends}  # fmt: skip

    assert methods(fleet(base)) == methods(load_fleet(COMPOSE_GPU_FLEET))


KINDS_IN_KUBECTL = {"deploy": "Deployment", "svc": "Service", "job": "Job"}


def test_readme_commands_name_real_objects_and_commands(base: Build) -> None:
    text = (K8S / "README.md").read_text(encoding="utf-8")
    references = re.findall(r"\b(deploy|svc|job)[/ ](draftgate-[\w-]+)", text)
    assert len(references) >= 4
    for short, name in references:
        base.named(KINDS_IN_KUBECTL[short], name)
    for path in re.findall(r"-k (deploy/k8s/\S+)", text):
        assert (ROOT / path / "kustomization.yaml").is_file(), path
    commands = [line.split(" -- ", 1)[1] for line in text.splitlines() if " -- draftgate " in line]
    assert commands
    for command in commands:
        parse_draftgate(shlex.split(command))
