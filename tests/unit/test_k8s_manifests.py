"""deploy/k8s, checked offline: every object against the Kubernetes schemas, kustomize
resolution, Services, probes and references, NetworkPolicies against the pods they name,
draftgate commands, and the README's commands."""

from __future__ import annotations

import base64
import copy
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml
from kubernetes_validate.utils import SchemaNotFoundError  # type: ignore[import-untyped]
from typer.exceptions import TyperException

from gateway.schemas.resources import KubernetesDiscovery
from tests.unit.k8s_queries import (
    ALL_INTERFACES,
    AUTOSCALE,
    BASE,
    DOCKERFILE,
    K8S,
    LOGIN,
    MODEL,
    MONITORING,
    NAMESPACE,
    ROOT,
    SIM,
    containers,
    draftgate_commands,
    env_value,
    fleet,
    only_container,
    parse_draftgate,
    pod_specs,
    pool_service,
    port_number,
    probes,
    selected_workloads,
    selects,
    workloads,
)
from tests.unit.kustomize_build import CLUSTER_SCOPED_KINDS, Build, KustomizeError, Manifest, build

# The oldest Kubernetes release still commonly run, and the newest the validator knows.
K8S_VERSIONS = ("1.30", kubernetes_validate.latest_version())


@pytest.fixture(scope="module")
def base() -> Build:
    return build(BASE)


@pytest.fixture(scope="module")
def sim() -> Build:
    return build(SIM)


@pytest.fixture(scope="module")
def login() -> Build:
    return build(LOGIN)


@pytest.fixture(scope="module", params=[BASE, SIM, LOGIN], ids=["base", "sim", "login"])
def any_directory(request: pytest.FixtureRequest) -> Path:
    directory: Path = request.param
    return directory


@pytest.fixture(scope="module")
def any_build(any_directory: Path) -> Build:
    return build(any_directory)


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
    no_container_name = copy.deepcopy(gateway)
    del no_container_name["spec"]["template"]["spec"]["containers"][0]["name"]
    for broken in (wrong_type, unknown_field, no_container_name):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, version, strict=True)
    with pytest.raises(SchemaNotFoundError):
        kubernetes_validate.validate({**gateway, "kind": "Deploymnet"}, version, strict=True)


def test_every_file_in_the_tree_is_read_by_a_kustomization(
    base: Build, sim: Build, login: Build
) -> None:
    on_disk = {p.resolve() for p in K8S.rglob("*") if p.is_file() and p.name != "README.md"}
    overlays = build(AUTOSCALE).files | build(MONITORING).files
    assert on_disk == base.files | sim.files | login.files | overlays


@pytest.mark.parametrize(
    "directory",
    [BASE, SIM, LOGIN, AUTOSCALE, MONITORING],
    ids=["base", "sim", "login", "autoscale", "monitoring"],
)
def test_every_namespaced_object_lands_in_the_stack_s_namespace(directory: Path) -> None:
    """An overlay's own objects get the namespace only when its kustomization sets one: a
    ScaledObject or a login proxy elsewhere would find no Deployment or Service to act on."""
    result = build(directory)
    [namespace] = result.of_kind("Namespace")
    assert namespace["metadata"]["name"] == NAMESPACE
    for obj in result.objects:
        if obj["kind"] not in CLUSTER_SCOPED_KINDS:
            where = f"{obj['kind']}/{obj['metadata']['name']}"
            assert obj["metadata"].get("namespace") == NAMESPACE, where


# The ScaledObject fields KEDA documents (keda.sh, v2 "Scaling Deployments"); a custom
# resource has no schema in the Kubernetes validator, so its shape is checked here.
SCALED_OBJECT_SPEC = {
    "scaleTargetRef", "pollingInterval", "cooldownPeriod", "initialCooldownPeriod",
    "idleReplicaCount", "minReplicaCount", "maxReplicaCount", "fallback", "advanced", "triggers",
}  # fmt: skip
DESIRED = re.compile(
    r'^sum\(draftgate_desired_replicas\{model="(?P<model>[^"]+)",method="(?P<method>[^"]+)"\}\)$'
)


def test_each_vllm_deployment_scales_on_its_pools_desired_replicas(base: Build) -> None:
    autoscale = build(AUTOSCALE)
    scaled = [o for o in autoscale.objects if o["kind"] == "ScaledObject"]
    others = [o for o in autoscale.objects if o["kind"] != "ScaledObject"]
    assert sorted(others, key=str) == sorted(base.objects, key=str)  # the base, unchanged
    method_of = {pool_service(p): p.backend.method for p in fleet(base).pools}
    vllm = {o["metadata"]["name"] for o in base.objects if o["kind"] == "Deployment"} & set(
        method_of
    )
    assert {o["spec"]["scaleTargetRef"]["name"] for o in scaled} == vllm  # one per pool
    for obj in scaled:
        spec = obj["spec"]
        assert obj["apiVersion"] == "keda.sh/v1alpha1"
        assert set(spec) <= SCALED_OBJECT_SPEC, set(spec) - SCALED_OBJECT_SPEC
        assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
        [trigger] = spec["triggers"]
        assert trigger["type"] == "prometheus"
        meta = trigger["metadata"]
        assert meta["threshold"] == "1"  # replicas = ceil(metric / 1): the gauge itself
        assert urlsplit(meta["serverAddress"]).scheme == "http"
        found = DESIRED.match(meta["query"])
        assert found is not None, meta["query"]
        target = spec["scaleTargetRef"]["name"]
        assert (found["model"], found["method"]) == (MODEL, method_of[target])


def test_only_the_gateway_holds_a_token_and_it_may_only_read_endpointslices(
    any_build: Build,
) -> None:
    """Discovery's least privilege: get, list and watch EndpointSlices in its namespace."""
    tokens = {
        where: pod.get("serviceAccountName", "default")
        for where, pod in pod_specs(any_build)
        if pod.get("automountServiceAccountToken", True)
    }
    assert tokens == {"Deployment/draftgate-gateway": "draftgate-gateway"}
    [account] = any_build.of_kind("ServiceAccount")
    assert account["metadata"]["name"] == "draftgate-gateway"
    assert any_build.of_kind("ClusterRole") == any_build.of_kind("ClusterRoleBinding") == []
    [role], [binding] = any_build.of_kind("Role"), any_build.of_kind("RoleBinding")
    assert role["rules"] == [
        {
            "apiGroups": ["discovery.k8s.io"],
            "resources": ["endpointslices"],
            "verbs": ["get", "list", "watch"],
        }
    ]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "draftgate-gateway", "namespace": NAMESPACE}
    ]
    # every pool is found through a Service of the stack, in the gateway's namespace
    services = {s["metadata"]["name"] for s in any_build.of_kind("Service")}
    for pool in fleet(any_build).pools:
        assert isinstance(pool.discovery, KubernetesDiscovery)
        assert pool.discovery.namespace is None
        assert pool.discovery.service in services


def test_a_missing_resource_or_unknown_feature_is_refused(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("resources: [absent.yaml]\n")
    with pytest.raises(KustomizeError, match=r"absent\.yaml"):
        build(tmp_path)
    (tmp_path / "kustomization.yaml").write_text("images: [{name: draftgate, newTag: v1}]\n")
    with pytest.raises(KustomizeError, match="images"):
        build(tmp_path)


def test_a_json_patch_whose_test_fails_is_refused(tmp_path: Path) -> None:
    """overlays/login/ guards each replaced list entry with a `test`: kustomize refuses the
    patch when the entry moved, and so must the resolver."""
    (tmp_path / "map.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: m}\ndata: {a: one}\n"
    )
    patch = (
        "resources: [map.yaml]\npatches:\n  - target: {kind: ConfigMap, name: m}\n"
        "    patch: |-\n      - {op: test, path: /data/a, value: %s}\n"
        "      - {op: replace, path: /data/a, value: two}\n"
    )
    (tmp_path / "kustomization.yaml").write_text(patch % "one")
    assert build(tmp_path).named("ConfigMap", "m")["data"] == {"a": "two"}
    (tmp_path / "kustomization.yaml").write_text(patch % "other")
    with pytest.raises(KustomizeError, match="test /data/a"):
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
@pytest.mark.parametrize(
    "directory",
    [BASE, SIM, LOGIN, AUTOSCALE, MONITORING],
    ids=["base", "sim", "login", "autoscale", "monitoring"],
)
def test_resolution_matches_kubectl_kustomize(directory: Path) -> None:
    ours = build(directory)
    out = subprocess.run(
        ["kubectl", "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
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


def test_each_service_selects_one_workload_and_targets_its_port(
    any_build: Build, any_directory: Path
) -> None:
    services = any_build.of_kind("Service")
    # gateway, dashboard, postgres, five backends; and the login proxy in overlays/login
    assert len(services) == (9 if any_directory == LOGIN else 8)
    for service in services:
        selector = service["spec"]["selector"]
        workloads = [
            w
            for kind in ("Deployment", "StatefulSet")
            for w in any_build.of_kind(kind)
            if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()
        ]
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


def test_every_scrape_annotation_names_a_declared_port(any_build: Build) -> None:
    scraped = [
        d
        for d in any_build.of_kind("Deployment")
        if d["spec"]["template"]["metadata"].get("annotations", {}).get("prometheus.io/scrape")
    ]
    assert len(scraped) == 1 + 5  # the gateway and every backend
    for deployment in scraped:
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        port_number(only_container(deployment), int(annotations["prometheus.io/port"]))
        assert annotations["prometheus.io/path"] == "/metrics"


def test_every_secret_configmap_claim_and_volume_reference_resolves(any_build: Build) -> None:
    secrets = {s["metadata"]["name"]: s["data"] for s in any_build.of_kind("Secret")}
    maps = {c["metadata"]["name"] for c in any_build.of_kind("ConfigMap")}
    claims = {c["metadata"]["name"] for c in any_build.of_kind("PersistentVolumeClaim")}
    for where, pod in pod_specs(any_build):
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        templates = {
            t["metadata"]["name"]
            for w in any_build.of_kind("StatefulSet")
            for t in w["spec"].get("volumeClaimTemplates", [])
        }
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


# --- network policies ----------------------------------------------------------------------


def _rules(policy: Manifest) -> list[tuple[str, Manifest]]:
    """("ingress" | "egress", rule) of a NetworkPolicy, in order."""
    return [(kind, rule) for kind in ("ingress", "egress") for rule in policy["spec"].get(kind, [])]


def _peers(rule: Manifest) -> list[Manifest]:
    peers: list[Manifest] = rule["from"] if "from" in rule else rule.get("to", [])
    return peers


def _admits(policy: Manifest, kind: str, peer: Manifest, port: int) -> bool:
    """Whether some `kind` rule of `policy` lets pods labelled like `peer` (a workload) in
    (ingress) or be reached (egress) on TCP `port`."""
    labels = peer["spec"]["template"]["metadata"]["labels"]
    for rule_kind, rule in _rules(policy):
        ports = [(p.get("protocol", "TCP"), p["port"]) for p in rule.get("ports", [])]
        if rule_kind != kind or (ports and ("TCP", port) not in ports):
            continue
        # Without a namespaceSelector a podSelector means pods of the policy's own namespace.
        if any(
            "podSelector" in p
            and "namespaceSelector" not in p
            and selects(p["podSelector"], labels)
            for p in _peers(rule)
        ):
            return True
    return False


def test_each_network_policy_selects_pods_and_names_pods_of_the_stack(
    any_build: Build, login: Build
) -> None:
    """A selector with a label the pods do not carry selects nothing, silently: each policy
    must apply to a pod of this build, and each peer it names must be a pod of the stack (the
    login overlay's, which holds every pod, the login proxy included), on a port it declares."""
    policies = any_build.of_kind("NetworkPolicy")
    assert {p["metadata"]["name"] for p in policies} == {"draftgate-dashboard", "postgres"}
    for policy in policies:
        name, spec = policy["metadata"]["name"], policy["spec"]
        targets = selected_workloads(any_build, spec["podSelector"])
        assert targets, f"NetworkPolicy {name} selects no pod"
        assert set(spec["policyTypes"]) == {
            k.capitalize() for k in ("ingress", "egress") if k in spec
        }
        for kind, rule in _rules(policy):
            ports = rule.get("ports", [])
            assert ports, f"{name}: a {kind} rule without ports opens every port"
            for peer in _peers(rule):
                if "podSelector" not in peer:
                    assert peer == {"namespaceSelector": {}}, f"{name}: {peer}"
                    assert {p["port"] for p in ports} == {53}, (
                        f"{name}: only DNS leaves the namespace"
                    )
                    continue
                assert "namespaceSelector" not in peer, f"{name}: {peer}"
                matched = selected_workloads(login, peer["podSelector"])
                assert matched, f"NetworkPolicy {name}: {kind} peer {peer} is no pod of the stack"
                # Ingress ports are the selected pods'; egress ports the peers'.
                for workload in targets if kind == "ingress" else matched:
                    for port in ports:
                        port_number(only_container(workload), port["port"])
    nowhere = {"matchLabels": {"app.kubernetes.io/name": "draftgat"}}
    assert selected_workloads(login, nowhere) == []  # the matcher is not always true
    assert len(selected_workloads(login, {})) == len(workloads(login))


def test_only_the_login_proxy_may_open_the_dashboard(base: Build, login: Build) -> None:
    policy = base.named("NetworkPolicy", "draftgate-dashboard")
    assert login.named("NetworkPolicy", "draftgate-dashboard") == policy
    dashboard = base.named("Deployment", "draftgate-dashboard")
    assert selected_workloads(base, policy["spec"]["podSelector"]) == [dashboard]
    port = port_number(only_container(dashboard), "http")
    # In the base no pod may: the dashboard is reached by `kubectl port-forward` alone.
    assert [w for w in workloads(base) if _admits(policy, "ingress", w, port)] == []
    proxy = login.named("Deployment", "oauth2-proxy")
    assert [w for w in workloads(login) if _admits(policy, "ingress", w, port)] == [proxy]


def test_the_dashboard_may_reach_its_gateway_and_dns_only(any_build: Build) -> None:
    policy = any_build.named("NetworkPolicy", "draftgate-dashboard")
    container = only_container(any_build.named("Deployment", "draftgate-dashboard"))
    url = urlsplit(env_value(container, "DRAFTGATE_DASHBOARD_GATEWAY_URL")["value"])
    service = any_build.named("Service", str(url.hostname))
    [gateway] = selected_workloads(any_build, {"matchLabels": service["spec"]["selector"]})
    [target] = [p["targetPort"] for p in service["spec"]["ports"] if p["port"] == url.port]
    assert _admits(policy, "egress", gateway, port_number(only_container(gateway), target))
    reachable = {
        w["metadata"]["name"]
        for w in workloads(any_build)
        for port in {
            p["containerPort"]
            for c in containers(w["spec"]["template"]["spec"])
            for p in c.get("ports", [])
        }
        if _admits(policy, "egress", w, port)
    }
    assert reachable == {"draftgate-gateway"}
    # Name lookups go to the cluster's DNS pods, in whichever namespace they run.
    anywhere: list[Manifest] = [{"namespaceSelector": {}}]
    lookups = [r for kind, r in _rules(policy) if kind == "egress" and _peers(r) == anywhere]
    assert [sorted((p["protocol"], p["port"]) for p in r["ports"]) for r in lookups] == [
        [("TCP", 53), ("UDP", 53)]
    ]


def test_postgres_admits_every_pod_with_a_database_url_and_no_other(any_build: Build) -> None:
    policy = any_build.named("NetworkPolicy", "postgres")
    postgres = any_build.named("StatefulSet", "postgres")
    assert selected_workloads(any_build, policy["spec"]["podSelector"]) == [postgres]
    port = port_number(only_container(postgres), "postgres")
    clients = {
        w["metadata"]["name"]
        for w in workloads(any_build)
        if any(
            e["name"] == "DRAFTGATE_DATABASE_URL"
            for c in containers(w["spec"]["template"]["spec"])
            for e in c.get("env", [])
        )
    }
    assert clients == {"draftgate-gateway", "draftgate-migrate"}
    admitted = {
        w["metadata"]["name"] for w in workloads(any_build) if _admits(policy, "ingress", w, port)
    }
    assert admitted == clients
    assert policy["spec"]["policyTypes"] == ["Ingress"]  # its egress (answers) is left alone


# --- the login overlay ----------------------------------------------------------------------


def test_login_overlay_is_the_base_with_a_proxy_and_an_admin_dashboard(
    base: Build, login: Build
) -> None:
    added = {(kind, "oauth2-proxy") for kind in ("Deployment", "Service", "ConfigMap", "Secret")}
    changed = ("Deployment", "draftgate-dashboard")

    def key(obj: Manifest) -> tuple[str, str]:
        return obj["kind"], obj["metadata"]["name"]

    assert {key(o) for o in login.objects} == {key(o) for o in base.objects} | added
    for obj in base.objects:
        if key(obj) != changed:
            assert login.named(*key(obj)) == obj, key(obj)
    before = copy.deepcopy(base.named(*changed))
    after = copy.deepcopy(login.named(*changed))
    old, new = only_container(before), only_container(after)
    assert new["command"] == [*old["command"], "--admin"]
    assert {e["name"] for e in old["env"]} - {e["name"] for e in new["env"]} == {
        "DRAFTGATE_ADMIN_READ_TOKEN"
    }
    for container in (old, new):
        del container["command"], container["env"]
    assert after == before  # nothing else of the dashboard changes


# --- draftgate commands and settings ------------------------------------------------------


def test_every_draftgate_command_is_a_real_subcommand_with_valid_flags(
    base: Build, sim: Build, login: Build
) -> None:
    commands = draftgate_commands(base) + draftgate_commands(sim) + draftgate_commands(login)
    # gateway, dashboard, migrate in each of the three; five simulators
    assert len(commands) == 3 + 3 + 3 + 5
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
