"""A real stack for the dashboard's tests: `draftgate up` (simulators, gateway, dashboard).

The stack runs once per test session: five simulated backends of the demo model, the
gateway with its collector and ledger, the dashboard process, and some chat completions
through the gateway and benchmark sweeps of three backends, so the ledger and the
measurements hold real data. AppTests run the
pages in this process against its admin API; the browser test opens its dashboard.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import (
    ADMIN_TOKEN,
    READ_TOKEN,
    Server,
    draftgate_env,
    free_port,
    free_port_block,
    spawn_server,
)

MODEL = "openai/gpt-oss-20b"
REQUESTS = 40
DATA_TIMEOUT_S = 60.0


@dataclass
class Stack:
    """The running stack: the gateway and how many requests went through it."""

    gateway: Server
    requests: int
    dashboard_url: str
    started: float  # monotonic seconds when `draftgate up` was started
    database_url: str  # the gateway's database, for tests that seed rows the API reads

    def admin(self) -> httpx.Client:
        """An admin API client of the gateway."""
        return self.gateway.client(ADMIN_TOKEN)


def _chat(base_url: str, i: int) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"hello {i}"}],
        "max_tokens": 24,
    }
    response = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 200, response.text


def _send_traffic(base_url: str, count: int) -> None:
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda i: _chat(base_url, i), range(count)))


def wait_for_runtime(admin: httpx.Client, name: str) -> dict[str, Any]:
    """Poll a backend until the gateway reports what it sees of it; its runtime."""
    deadline = time.monotonic() + DATA_TIMEOUT_S
    while time.monotonic() < deadline:
        runtime: dict[str, Any] | None = admin.get(f"/admin/v1/backends/{name}").json()["runtime"]
        if runtime is not None:
            return runtime
        time.sleep(0.2)
    pytest.fail(f"backend {name} has no runtime after {DATA_TIMEOUT_S} s")


SWEPT = ("demo-plain", "demo-eagle3", "demo-dflash")


def wait_for_benchmark(admin: httpx.Client, run_id: int) -> dict[str, Any]:
    """Poll a benchmark run until it is no longer queued or running; the run."""
    deadline = time.monotonic() + DATA_TIMEOUT_S
    while time.monotonic() < deadline:
        run: dict[str, Any] = admin.get(f"/admin/v1/benchmarks/{run_id}").json()
        if run["status"] not in {"queued", "running"}:
            return run
        time.sleep(0.5)
    pytest.fail(f"benchmark {run_id} still running after {DATA_TIMEOUT_S} s")


def _sweep(admin: httpx.Client) -> None:
    """Benchmark a few backends at three loads, so the planner has measurements to fit."""
    body = {"concurrency": [1, 4, 16], "requests_per_level": 16}
    runs = [admin.post("/admin/v1/benchmarks", json=body | {"backend": b}).json() for b in SWEPT]
    for run in runs:
        finished = wait_for_benchmark(admin, run["id"])
        assert finished["status"] == "succeeded", finished


def _wait_for_data(admin: httpx.Client, requests: int) -> None:
    """Until the ledger rolled up every request and the collector stored measurements."""
    deadline = time.monotonic() + DATA_TIMEOUT_S
    while time.monotonic() < deadline:
        rows = admin.get("/admin/v1/savings").json()["data"]
        points = admin.get("/admin/v1/accuracy").json()["points"]
        if sum(r["requests"] for r in rows) >= requests and points:
            return
        time.sleep(0.5)
    pytest.fail(f"no ledger or measurement data after {DATA_TIMEOUT_S} s: {rows}, {points}")


def wait_for_dashboard(url: str, server: Server | None = None) -> None:
    """Poll the dashboard's health path until it answers (failing with the output of
    `server`, the dashboard's process, if it exits first)."""
    deadline = time.monotonic() + DATA_TIMEOUT_S
    while time.monotonic() < deadline:
        if server is not None:
            assert server.process.poll() is None, server.output()
        try:
            if httpx.get(f"{url}/_stcore/health", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    output = "" if server is None else f":\n{server.output()}"
    pytest.fail(f"the dashboard at {url} did not answer within {DATA_TIMEOUT_S} s{output}")


def stack_env(database_url: str) -> dict[str, str]:
    """Settings of the test stack: a known token, quick collector, ledger and probes."""
    return draftgate_env(
        DRAFTGATE_ADMIN_TOKEN=ADMIN_TOKEN,
        DRAFTGATE_ADMIN_READ_TOKEN=READ_TOKEN,
        DRAFTGATE_DATABASE_URL=database_url,
        DRAFTGATE_COLLECT_INTERVAL_S="1",
        DRAFTGATE_MEASUREMENT_WINDOW_S="2",
        DRAFTGATE_MEASUREMENT_MIN_REQUESTS="1",  # 2 s windows of a few test requests
        DRAFTGATE_MEASUREMENT_MIN_OUTPUT_TOKENS="1",
        DRAFTGATE_LEDGER_FLUSH_INTERVAL_S="0.2",
        DRAFTGATE_PROBE_INTERVAL_S="0.5",
    )


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """`draftgate up` (its dashboard included) with traffic sent through it."""
    log_dir: Path = tmp_path_factory.mktemp("dashboard-stack")
    dashboard_port = free_port()
    args = ("up", "--sim-base-port", str(free_port_block(5)), "--time-scale", "20",
            "--dashboard-port", str(dashboard_port))  # fmt: skip
    started = time.monotonic()
    database_url = f"sqlite:///{log_dir}/draftgate.db"
    server = spawn_server(args, stack_env(database_url), log_dir)
    try:
        server.wait_healthy(60.0)
        _send_traffic(server.base_url, REQUESTS)
        with server.client(ADMIN_TOKEN) as admin:
            _wait_for_data(admin, REQUESTS)
            _sweep(admin)
        dashboard_url = f"http://127.0.0.1:{dashboard_port}"
        wait_for_dashboard(dashboard_url)
        yield Stack(server, REQUESTS, dashboard_url, started, database_url)
    finally:
        server.close()


@pytest.fixture
def dashboard_env(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> Stack:
    """The dashboard's settings pointing at the stack's gateway, acting with its admin token."""
    monkeypatch.setenv("DRAFTGATE_DASHBOARD_GATEWAY_URL", stack.gateway.base_url)
    monkeypatch.setenv("DRAFTGATE_ADMIN_TOKEN", ADMIN_TOKEN)
    monkeypatch.setenv("DRAFTGATE_DASHBOARD_ADMIN", "true")
    return stack


@pytest.fixture
def read_only_env(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> Stack:
    """The dashboard's settings pointing at the stack's gateway, with the read token only."""
    monkeypatch.setenv("DRAFTGATE_DASHBOARD_GATEWAY_URL", stack.gateway.base_url)
    monkeypatch.setenv("DRAFTGATE_ADMIN_READ_TOKEN", READ_TOKEN)
    monkeypatch.delenv("DRAFTGATE_ADMIN_TOKEN", raising=False)
    monkeypatch.delenv("DRAFTGATE_DASHBOARD_ADMIN", raising=False)
    return stack
