"""Questions the Kubernetes checks ask of built manifests: pods, containers, ports,
environment, label selectors, the fleet file the gateway mounts, draftgate command lines and
oauth2-proxy's options."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import typer.main
import yaml
from typer.core import TyperGroup

from gateway.cli import main as cli
from gateway.schemas.resources import BackendCreate, DnsDiscovery, PoolCreate
from gateway.services.fleet import Fleet
from tests.unit.kustomize_build import Build, Manifest

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
DOCKERFILE = ROOT / "Dockerfile"
BASE = K8S / "base"
SIM = K8S / "overlays" / "sim"
AUTOSCALE = K8S / "overlays" / "autoscale"
LOGIN = K8S / "overlays" / "login"
MONITORING = K8S / "overlays" / "monitoring"
NAMESPACE = "draftgate"
MODEL = "Qwen/Qwen3-8B"
# The published Qwen3-8B drafter of each method the GPU fleet serves.
DRAFTERS = {
    "plain": None,
    "eagle3": "RedHatAI/Qwen3-8B-speculator.eagle3",
    "p-eagle": "RedHatAI/Qwen3-8B-speculator.peagle",
    "dflash": "z-lab/Qwen3-8B-DFlash-b16",
    "dspark": "deepseek-ai/dspark_qwen3_8b_block7",
}
WORKLOAD_KINDS = ("Deployment", "StatefulSet", "Job")
GPU = "nvidia.com/gpu"
# Pods are reached on their pod IP, so every server in them listens on all interfaces.
ALL_INTERFACES = "0.0.0.0"  # noqa: S104


def pod_specs(result: Build) -> Iterator[tuple[str, Manifest]]:
    for kind in WORKLOAD_KINDS:
        for obj in result.of_kind(kind):
            yield f"{kind}/{obj['metadata']['name']}", obj["spec"]["template"]["spec"]


def workloads(result: Build) -> list[Manifest]:
    """Every object with a pod template (Deployments, StatefulSets, Jobs)."""
    return [obj for kind in WORKLOAD_KINDS for obj in result.of_kind(kind)]


def selects(selector: Manifest, labels: dict[str, str]) -> bool:
    """Whether a LabelSelector (matchLabels and matchExpressions) matches `labels`; the
    empty selector matches everything, as Kubernetes reads it."""
    unknown = set(selector) - {"matchLabels", "matchExpressions"}
    assert not unknown, f"not a LabelSelector (a Service's plain labels?): {selector}"
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator, values = expression["key"], expression["operator"], expression.get("values")
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


def selected_workloads(result: Build, selector: Manifest) -> list[Manifest]:
    """The workloads whose pods `selector` matches."""
    return [
        w
        for w in workloads(result)
        if selects(selector, w["spec"]["template"]["metadata"]["labels"])
    ]


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
    return {
        kind: container[kind]
        for kind in ("startupProbe", "livenessProbe", "readinessProbe")
        if kind in container
    }


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


def pool_backends(declared: Fleet) -> list[BackendCreate]:
    """Each pool as the backend its Service stands for (`http://service:port`): every ready
    pod behind it becomes one like it."""
    return [
        BackendCreate.model_validate(
            {
                **pool.backend.model_dump(),
                "name": pool.name,
                "url": f"{pool.discovery.scheme}://{pool_service(pool)}:{pool.discovery.port}",
            }
        )
        for pool in declared.pools
    ]


def pool_service(pool: PoolCreate) -> str:
    """The Service whose pods are `pool`'s members (a DNS source names it by its short name)."""
    source = pool.discovery
    return source.dns if isinstance(source, DnsDiscovery) else source.service


def backend_deployment(result: Build, url: str) -> tuple[Manifest, Manifest]:
    """The Service a backend URL names (`http://service:port`) and the Deployment behind it."""
    parts = urlsplit(url)
    service = result.named("Service", str(parts.hostname))
    assert [p["port"] for p in service["spec"]["ports"]] == [parts.port], url
    selector = service["spec"]["selector"]
    [deployment] = [
        d
        for d in result.of_kind("Deployment")
        if selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
    ]
    return service, deployment


# --- schemas and resolution --------------------------------------------------------------


# --- oauth2-proxy ----------------------------------------------------------------------------

# What oauth2-proxy needs to sign users in with OpenID Connect and forward them upstream, by
# its option names (a flag `--email-domain` is the option `email_domains`, the environment
# variable OAUTH2_PROXY_EMAIL_DOMAINS).
OAUTH2_PROXY_REQUIRED = frozenset(
    {
        "provider",
        "oidc_issuer_url",
        "client_id",
        "client_secret",
        "cookie_secret",
        "redirect_url",
        "email_domains",
        "upstreams",
        "http_address",
    }
)
_OAUTH2_PROXY_FLAG_OPTIONS = {"email-domain": "email_domains", "upstream": "upstreams"}
OAUTH2_PROXY_PING = "/ping"  # its default ping path, answered without a session
OAUTH2_PROXY_COOKIE_SECRET_BYTES = (16, 24, 32)  # AES key sizes; anything else is refused


def oauth2_proxy_options(flags: list[str], env: dict[str, str]) -> dict[str, str]:
    """oauth2-proxy's options from its `--flag=value` arguments over its OAUTH2_PROXY_*
    environment (flags win, as in oauth2-proxy), by option name."""
    options = {
        name.removeprefix("OAUTH2_PROXY_").lower(): value
        for name, value in env.items()
        if name.startswith("OAUTH2_PROXY_")
    }
    for flag in flags:
        name, sep, value = flag.removeprefix("--").partition("=")
        assert flag.startswith("--"), f"not a flag: {flag}"
        assert sep, f"not --flag=value: {flag}"
        options[_OAUTH2_PROXY_FLAG_OPTIONS.get(name, name.replace("-", "_"))] = value
    return options


def resolved_env(result: Build, container: Manifest) -> dict[str, str]:
    """A container's environment, ConfigMap and Secret references read from the build."""
    env = {}
    for entry in container.get("env", []):
        source = entry.get("valueFrom", {})
        if "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            env[entry["name"]] = secret_value(result, ref["name"], ref["key"])
        elif "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            env[entry["name"]] = result.named("ConfigMap", ref["name"])["data"][ref["key"]]
        else:
            env[entry["name"]] = entry["value"]
    return env
