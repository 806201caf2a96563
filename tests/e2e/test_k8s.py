"""The sim overlay of deploy/k8s run as local processes: its migrate Job, its five simulated
backends, its gateway and its read-only dashboard, each with the command and environment its
manifest gives it, on loopback addresses in place of pod IPs, their Services' EndpointSlices
served by the stand-in Kubernetes API (tests/kube_api.py, which says why not a real one) to
the gateway's service account, on the real PostgreSQL; then the login overlay's admin
dashboard against that gateway."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import yaml

from dashboard.client import AdminApiError
from tests.e2e.conftest import (
    ADMIN_TOKEN,
    CLI_TIMEOUT_S,
    DRAFTGATE,
    POLL_INTERVAL_S,
    READ_TOKEN,
    Server,
    draftgate_env,
    free_port,
)
from tests.e2e.test_compose_stack import dashboard_client, host_status
from tests.kube_api import KubeApi
from tests.unit.k8s_queries import LOGIN, NAMESPACE, SIM, only_container
from tests.unit.kustomize_build import Build, Manifest, build

READY_TIMEOUT_S = 90.0  # five simulators and a gateway starting on a busy machine
KEY_VISIBLE_TIMEOUT_S = 30.0
KUBE_TOKEN = (
    "gateway-service-account-token"  # registry reloads every 2 s (DRAFTGATE_REGISTRY_REFRESH_S)
)

pytestmark = pytest.mark.postgres


def _on_loopback(argv: list[str], port: int, host: str = "127.0.0.1") -> list[str]:
    """`argv` with its --host and --port values swapped for `host` and `port`."""
    swapped = list(argv)
    for flag, value in (("--host", host), ("--port", str(port))):
        swapped[swapped.index(flag) + 1] = value
    return swapped


def _spawn(argv: list[str], port: int, env: dict[str, str], log_dir: Path, name: str) -> Server:
    """Run a manifest's `draftgate ...` command with this virtualenv's draftgate."""
    assert argv[0] == "draftgate"
    log_path = log_dir / f"{name}.log"
    log_file = log_path.open("wb")
    process = subprocess.Popen(
        [str(DRAFTGATE), *argv[1:]],
        env=env,
        cwd=log_dir,
        stdin=subprocess.DEVNULL,
        stdout=log_file,
        stderr=subprocess.STDOUT,
    )
    return Server(process=process, port=port, log_path=log_path, log_file=log_file)


def _pod_env(container: Manifest, secrets: dict[str, str]) -> dict[str, str]:
    """The container's environment; secret references take their value from `secrets`."""
    env: dict[str, str] = {}
    for entry in container.get("env", []):
        ref = entry.get("valueFrom", {}).get("secretKeyRef")
        env[entry["name"]] = secrets[ref["key"]] if ref else entry["value"]
    return env


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    started: list[Server] = []
    try:
        yield started
    finally:
        for server in started:
            server.close()


def _start_backends(
    stack: Build, log_dir: Path, servers: list[Server], port: int, kube: KubeApi
) -> dict[str, str]:
    """Each simulated backend on a loopback address of its own, all on `port` (as pods share
    a container port), the ready endpoint of its Service; Service -> address."""
    addresses = {}
    for deployment in stack.objects:
        labels = deployment["metadata"].get("labels", {})
        if deployment["kind"] != "Deployment" or labels.get("app.kubernetes.io/name") != "vllm":
            continue
        name, address = deployment["metadata"]["name"], f"127.0.0.{20 + len(addresses)}"
        container = only_container(deployment)
        argv = _on_loopback(container["command"], port, address)
        servers.append(_spawn(argv, port, draftgate_env(), log_dir, name))
        addresses[name] = address
        kube.set_endpoints(NAMESPACE, name, {address: True})
    return addresses


def _loopback_fleet(stack: Build, port: int, path: Path) -> Path:
    """The ConfigMap's fleet.yaml with each pool's port the simulators' loopback port."""
    fleet: dict[str, Any] = yaml.safe_load(
        stack.named("ConfigMap", "draftgate-fleet")["data"]["fleet.yaml"]
    )
    assert "backends" not in fleet  # every method is a pool of pods
    for pool in fleet["pools"]:
        pool["discovery"]["port"] = port
    path.write_text(yaml.safe_dump(fleet, sort_keys=False), encoding="utf-8")
    return path


def _wait_healthy(url: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(POLL_INTERVAL_S * 10)
    pytest.fail(f"{url}/health not ready within {READY_TIMEOUT_S} s")


def _wait_ready(server: Server, path: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    with httpx.Client(base_url=server.base_url, timeout=5.0) as http:
        while time.monotonic() < deadline:
            assert server.process.poll() is None, server.output()
            try:
                if http.get(path).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(POLL_INTERVAL_S * 10)
    pytest.fail(f"{path} not ready within {READY_TIMEOUT_S} s:\n{server.output()}")


@pytest.fixture
def kube() -> Iterator[KubeApi]:
    with KubeApi(KUBE_TOKEN, {NAMESPACE}) as server:
        yield server


def _service_account(directory: Path) -> Path:
    """What Kubernetes mounts in the gateway's pod for its service account."""
    directory.mkdir()
    (directory / "token").write_text(KUBE_TOKEN)
    (directory / "namespace").write_text(NAMESPACE)
    return directory


def test_sim_overlay_runs_as_its_manifests_say(
    postgres_schema: str,
    kube: KubeApi,
    tmp_path: Path,
    servers: list[Server],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stack = build(SIM)
    secrets = {
        "admin-token": ADMIN_TOKEN,
        "admin-read-token": READ_TOKEN,
        "database-url": postgres_schema,
    }

    job = only_container(stack.named("Job", "draftgate-migrate"))
    migrate = subprocess.run(
        [str(DRAFTGATE), *job["command"][1:]],
        env=draftgate_env(**_pod_env(job, secrets)),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )
    assert migrate.returncode == 0, migrate.stderr
    assert "upgraded from empty to revision" in migrate.stdout

    backend_port = free_port()
    addresses = _start_backends(stack, tmp_path, servers, backend_port, kube)
    assert len(addresses) == 5
    for address in addresses.values():
        _wait_healthy(f"http://{address}:{backend_port}")

    gateway = only_container(stack.named("Deployment", "draftgate-gateway"))
    env = _pod_env(gateway, secrets)
    port = free_port()
    fleet = _loopback_fleet(stack, backend_port, tmp_path / "fleet.yaml")
    env |= {
        "DRAFTGATE_HOST": "127.0.0.1",
        "DRAFTGATE_PORT": str(port),
        "DRAFTGATE_FLEET": str(fleet),
        # in a pod: the cluster's API server, and the account Kubernetes mounts
        "DRAFTGATE_KUBE_API_URL": kube.url,
        "DRAFTGATE_KUBE_SERVICE_ACCOUNT_DIR": str(_service_account(tmp_path / "account")),
    }
    servers.append(_spawn(gateway["command"], port, draftgate_env(**env), tmp_path, "gateway"))
    _wait_ready(servers[-1], gateway["readinessProbe"]["httpGet"]["path"])
    gateway_server = servers[-1]

    # API keys are required, as in the manifest: create one the way the README says.
    created = subprocess.run(
        [str(DRAFTGATE), "keys", "create", "k8s-e2e"],
        env=draftgate_env(**env),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip().splitlines()[-1]

    with servers[-1].client(key) as client:
        # A key written by the CLI reaches the gateway's registry on its next reload.
        deadline = time.monotonic() + KEY_VISIBLE_TIMEOUT_S
        while True:
            reply = client.post(
                "/v1/chat/completions",
                json={
                    "model": "Qwen/Qwen3-8B",
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 8,
                },
            )
            if reply.status_code != 401 or time.monotonic() > deadline:
                break
            time.sleep(POLL_INTERVAL_S * 10)
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] > 0
        served_by = reply.headers["x-draftgate-backend"]
        refused = client.post(
            "/v1/chat/completions",
            headers={"Authorization": "Bearer nope"},
            json={"model": "Qwen/Qwen3-8B", "messages": []},
        )
        assert refused.status_code == 401
    # The dashboard answers its probe's path, reading this gateway's admin API.
    dashboard = only_container(stack.named("Deployment", "draftgate-dashboard"))
    dashboard_env = _pod_env(dashboard, secrets)
    dashboard_env["DRAFTGATE_DASHBOARD_GATEWAY_URL"] = servers[-1].base_url
    dashboard_port = free_port()
    argv = _on_loopback(dashboard["command"], dashboard_port)
    servers.append(_spawn(argv, dashboard_port, draftgate_env(**dashboard_env), tmp_path, "ui"))
    probe_path = dashboard["readinessProbe"]["httpGet"]["path"]
    _wait_ready(servers[-1], probe_path)
    # Streamlit answers any path with its page; only its health endpoint says "ok".
    assert httpx.get(servers[-1].base_url + probe_path, timeout=10.0).text == "ok"
    # Read-only: the client its pages make holds the read token, and changes are refused.
    assert "DRAFTGATE_ADMIN_TOKEN" not in dashboard_env
    reader = dashboard_client(dashboard_env, dashboard["command"], monkeypatch)
    assert reader.scope() == "read"
    with pytest.raises(AdminApiError) as forbidden:
        reader.revoke_key(10**9)  # an admin would get a 404
    assert forbidden.value.status_code == 403, forbidden.value.message
    # It answers `kubectl port-forward` (Host localhost) and its Service's name; the
    # kubelet's probe, whose Host is the pod's IP, gets its health path and nothing else.
    pod_port = dashboard["ports"][0]["containerPort"]
    assert host_status(servers[-1], f"localhost:{pod_port}") == 200
    assert host_status(servers[-1], f"draftgate-dashboard:{pod_port}") == 200
    assert host_status(servers[-1], f"10.1.2.3:{pod_port}") == 403
    assert host_status(servers[-1], f"10.1.2.3:{pod_port}", probe_path) == 200

    # overlays/login's dashboard, against the same gateway: the admin token, and only the
    # public name oauth2-proxy passes through (and port-forward's localhost) answered.
    login = build(LOGIN)
    admin = only_container(login.named("Deployment", "draftgate-dashboard"))
    admin_env = _pod_env(admin, secrets)
    assert "DRAFTGATE_ADMIN_READ_TOKEN" not in admin_env
    admin_env["DRAFTGATE_DASHBOARD_GATEWAY_URL"] = gateway_server.base_url
    admin_port = free_port()
    argv = _on_loopback(admin["command"], admin_port)
    servers.append(_spawn(argv, admin_port, draftgate_env(**admin_env), tmp_path, "ui-admin"))
    _wait_ready(servers[-1], probe_path)
    actor = dashboard_client(admin_env, admin["command"], monkeypatch)
    assert actor.scope() == "admin"
    public = urlsplit(login.named("ConfigMap", "oauth2-proxy")["data"]["redirect-url"])
    assert host_status(servers[-1], public.netloc) == 200
    assert host_status(servers[-1], f"localhost:{pod_port}") == 200
    assert host_status(servers[-1], f"draftgate-dashboard:{pod_port}") == 403
    with gateway_server.client(ADMIN_TOKEN) as http:
        backends = http.get("/admin/v1/backends").json()["data"]
    by_url = {b["url"]: b for b in backends}
    assert set(by_url) == {f"http://{a}:{backend_port}" for a in addresses.values()}
    assert {b["pool"] for b in backends} == {
        f"qwen3-8b-{n.split('qwen3-8b-')[1]}" for n in addresses
    }
    assert served_by in {b["name"] for b in backends}
    # found as the manifest's service account: its token, its namespace's EndpointSlices
    assert {r["token"] for r in kube.requests} == {f"Bearer {KUBE_TOKEN}"}
    assert {r["path"] for r in kube.requests} == {
        f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices"
    }
    assert set(addresses) == {
        o["metadata"]["name"]
        for o in stack.objects
        if o["kind"] == "Service" and o["metadata"]["name"].startswith("vllm-")
    }
