"""`draftgate gateway --workers 2`: two processes on one port, one of them leading.

A real gateway with two workers in front of a plain and a P-EAGLE simulator, the official
`openai` client as the client. Which worker accepts a connection is the kernel's choice, so
the tests send requests on fresh connections until each worker has served some (read from
the per-process metrics files in the workers' shared directory), then check what holds
whichever worker served: every request counted once in `/metrics` and in the ledger, every
worker routing by the leader's choice, and a killed leader replaced without losing a count.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.mmap_dict import MmapedDict

from gateway.server.replica import GAUGES_FILE
from tests.e2e.conftest import (
    ADMIN_TOKEN,
    DRAFTGATE,
    HEALTH_TIMEOUT_S,
    SIM_MODEL,
    ModuleServerStarter,
    Server,
    fleet_backend,
    free_port,
    gateway_env,
    metric_value,
    sim_args,
    spawn_server,
    wait_for_metric,
    wait_for_usage_records,
    write_fleet,
)

WORKERS = 2
BATCH = 6  # requests sent at once, each on its own connection
SERVE_TIMEOUT_S = 60.0  # a deadline for both workers to have served, not a wait
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
MESSAGES = [{"role": "user", "content": "hi"}]
PRICE = {"gpu_type": "B200", "usd_per_gpu_hour": 6.0, "source": "test", "date": "2026-12-01"}


@dataclass
class Replica:
    """The gateway's supervisor and its workers' shared directory."""

    gateway: Server
    state: Path
    database_url: str
    plain: Server  # the plain simulator behind it

    def workers(self) -> list[int]:
        """The supervisor's live children."""
        pid = self.gateway.process.pid
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text(encoding="utf-8")
        return [int(p) for p in children.split()]

    def leader(self) -> int | None:
        """The pid in the leader lock, if a live worker holds it."""
        text = (self.state / "leader.lock").read_text(encoding="utf-8").strip()
        return int(text) if text.isdigit() and int(text) in self.workers() else None

    def served_by_pid(self) -> dict[int, float]:
        """/v1 requests each worker (dead ones too) has counted, from its metrics file."""
        return self.counted_by_pid("draftgate_requests_total")

    def counted_by_pid(self, sample: str, **labels: str) -> dict[int, float]:
        """A counter's `sample` (over the series that carry `labels`) in each worker's
        metrics file."""
        counted: dict[int, float] = {}
        for path in (self.state / "metrics").glob("counter_*.db"):
            pid = int(path.stem.removeprefix("counter_"))
            for key, value, _, _ in MmapedDict.read_all_values_from_file(str(path)):
                _, name, series, _ = json.loads(key)
                if name == sample and labels.items() <= series.items():
                    counted[pid] = counted.get(pid, 0.0) + value
        return counted


def wait_until(condition: Callable[[], object], what: str, timeout_s: float = 30.0) -> None:
    """Poll `condition` until it is true; fail naming `what` at the deadline."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout_s} s: {what}")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def replica(
    start_module_servers: ModuleServerStarter, tmp_path_factory: pytest.TempPathFactory
) -> Replica:
    plain, peagle = start_module_servers(
        sim_args("--time-scale", "20"),
        sim_args("--method", "p-eagle", "--k", "7", "--time-scale", "20"),
    )
    directory = tmp_path_factory.mktemp("workers")
    backends = [
        fleet_backend("w-plain", plain.base_url),
        fleet_backend("w-peagle", peagle.base_url, "p-eagle"),
    ]
    models = [{"name": SIM_MODEL, "policy": {"mode": "auto"}}]
    fleet = write_fleet(directory / "fleet.yaml", backends, models)
    database_url = f"sqlite:///{directory}/draftgate.db"
    state = directory / "state"
    env = gateway_env(database_url, fleet, WORKER_STATE_DIR=str(state), SELECTOR_INTERVAL_S="0.5")
    gateway = spawn_server(("gateway", "--workers", str(WORKERS)), env, directory)
    try:
        gateway.wait_healthy()
        running = Replica(gateway, state, database_url, plain)
        wait_until(lambda: len(running.workers()) == WORKERS, "both workers started")
        wait_until(running.leader, "a worker leads", HEALTH_TIMEOUT_S)
        yield running
    finally:
        gateway.close()


def stop_outside_a_write(pid: int, database_url: str) -> None:
    """SIGSTOP `pid` at a moment it holds no write lock on the SQLite database, so that
    another worker can write while it stands still."""
    database = database_url.removeprefix("sqlite:///")
    deadline = time.monotonic() + 30.0
    while True:
        os.kill(pid, signal.SIGSTOP)
        wait_until(lambda: _stopped(pid), f"worker {pid} stopped")
        try:
            with sqlite3.connect(database, timeout=0) as probe:
                probe.execute("BEGIN IMMEDIATE")  # the write lock, if nobody holds it
                probe.rollback()
            return
        except sqlite3.OperationalError:  # stopped mid-transaction: let it finish
            os.kill(pid, signal.SIGCONT)
            assert time.monotonic() < deadline, f"worker {pid} held the write lock for 30 s"


def _stopped(pid: int) -> bool:
    """Every thread of `pid` is stopped by a signal."""
    tasks = Path(f"/proc/{pid}/task").iterdir()
    return all((t / "stat").read_text().rpartition(")")[2].split()[0] == "T" for t in tasks)


def _client(replica: Replica) -> openai.OpenAI:
    """The official client, a new connection per request (so the kernel picks a worker)."""
    http = httpx.Client(limits=httpx.Limits(max_keepalive_connections=0), timeout=30.0)
    base_url = f"{replica.gateway.base_url}/v1"
    return openai.OpenAI(base_url=base_url, api_key="none", max_retries=0, http_client=http)


def _send_until_every_worker_served(replica: Replica) -> dict[str, str]:
    """Chat completions in batches until each live worker has served one since the start;
    the method that served each, by x-request-id."""
    before = replica.served_by_pid()
    methods: dict[str, str] = {}

    def one(client: openai.OpenAI) -> None:
        request_id = uuid.uuid4().hex
        response = client.chat.completions.with_raw_response.create(
            model=SIM_MODEL,
            messages=[{"role": "user", "content": f"count to three ({request_id})"}],
            max_tokens=8,
            extra_headers={"x-request-id": request_id},
        )
        response.parse()
        methods[request_id] = response.headers["x-draftgate-method"]

    def every_worker_served() -> bool:
        served = replica.served_by_pid()
        return all(served.get(pid, 0.0) > before.get(pid, 0.0) for pid in replica.workers())

    deadline = time.monotonic() + SERVE_TIMEOUT_S
    with _client(replica) as client, ThreadPoolExecutor(BATCH) as pool:
        while not every_worker_served():
            if time.monotonic() > deadline:
                pytest.fail(f"not every worker served within {SERVE_TIMEOUT_S} s")
            list(pool.map(lambda _: one(client), range(BATCH)))
    return methods


def test_a_follower_serves_by_the_leaders_choices_and_gauges(replica: Replica) -> None:
    base_url = replica.gateway.base_url
    priced = httpx.post(f"{base_url}/admin/v1/prices", json=PRICE, headers=ADMIN)
    assert priced.status_code == 201, priced.text
    choices = replica.state / "choices.json"

    def published() -> dict[str, object] | None:
        now = json.loads(choices.read_text(encoding="utf-8"))["fleet_now"].get(SIM_MODEL)
        return now if now and now["routed_method"] == "p-eagle" else None

    def gauges() -> bytes:
        return (replica.state / GAUGES_FILE).read_bytes()

    # priced, the selector routes to P-EAGLE (half plain's $/1M at low load); the leader
    # writes its choices, then its gauges, so both are wanted before it is stopped
    wait_until(published, "the leader's selector priced the model's methods")
    wait_until(
        lambda: b'draftgate_method_usd_per_mtok{method="p-eagle"' in gauges(),
        "the leader published its price gauges",
    )
    leader = replica.leader()
    [follower] = [pid for pid in replica.workers() if pid != leader]
    assert leader is not None
    served = replica.served_by_pid().get(follower, 0.0)
    stop_outside_a_write(leader, replica.database_url)  # the follower answers all now
    try:
        with httpx.Client(base_url=base_url, headers=ADMIN, timeout=10.0) as http:
            # the follower's own registry, refreshed from the database, prices the curves
            wait_until(
                lambda: http.get("/admin/v1/curves").json()["curves"][0]["usd_per_gpu_hour"],
                "the follower read the new price",
            )
            leaders = published()
            assert leaders is not None

            def followers() -> object:  # only the leader's selector computes it
                return http.get("/admin/v1/fleet", params={"model": SIM_MODEL}).json()["now"]

            wait_until(lambda: followers() == leaders, "the follower adopted the leader's sizing")
            # the replica's gauges are the stopped leader's, as it last wrote them (whether
            # the replica was ready then is the machine's business, not this test's)
            exposition = http.get("/metrics").content
            leaders_gauges = gauges()
            assert b"\ndraftgate_ready " in leaders_gauges
            assert exposition.endswith(leaders_gauges)
            assert b'draftgate_method_usd_per_mtok{method="p-eagle"' in exposition
            with _client(replica) as client:
                answer = client.chat.completions.with_raw_response.create(
                    model=SIM_MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
                )
            assert answer.headers["x-draftgate-method"] == "p-eagle"
        # counted when the request settles, just after its answer is sent
        wait_until(
            lambda: replica.served_by_pid().get(follower, 0.0) == served + 1,
            "the follower counted the request it served",
        )
    finally:
        os.kill(leader, signal.SIGCONT)


def test_a_benchmark_runs_in_the_leader_and_stops_when_cancelled_through_a_follower(
    replica: Replica,
) -> None:
    body = {"backend": "w-plain", "concurrency": [4], "duration_s": 120, "output_len": 64}
    with httpx.Client(base_url=replica.gateway.base_url, headers=ADMIN, timeout=10.0) as http:
        run_id = http.post("/admin/v1/benchmarks", json=body).json()["id"]

        def run() -> dict[str, Any]:
            answer: dict[str, Any] = http.get(f"/admin/v1/benchmarks/{run_id}").json()
            return answer

        def sim_running() -> float:
            return metric_value(replica.plain.base_url, "vllm:num_requests_running")

        wait_until(lambda: run()["status"] == "running", "the leader claimed the run")
        wait_until(lambda: sim_running() > 0, "the sweep loads the backend")
        leader = replica.leader()
        assert leader is not None
        stop_outside_a_write(leader, replica.database_url)  # the follower answers the cancel
        try:
            url = f"{replica.gateway.base_url}/admin/v1/benchmarks/{run_id}"
            cancelled = httpx.delete(url, headers=ADMIN, timeout=10.0)  # a new connection
            assert cancelled.status_code == 200, cancelled.text
            assert cancelled.json()["status"] == "cancelled"
        finally:
            os.kill(leader, signal.SIGCONT)
        wait_until(lambda: run()["result"] is not None, "the leader stopped the sweep")
        wait_until(lambda: sim_running() == 0, "the backend is idle again")
        assert run()["status"] == "cancelled"


def test_each_request_is_counted_once_whichever_worker_served_it(replica: Replica) -> None:
    counted = metric_value(replica.gateway.base_url, "draftgate_requests_total")
    methods = _send_until_every_worker_served(replica)
    wait_for_metric(replica.gateway.base_url, "draftgate_requests_total", counted + len(methods))
    records = wait_for_usage_records(replica.database_url, methods)
    assert len(records) == len(methods)
    assert sum(replica.served_by_pid().values()) == counted + len(methods)


def test_a_killed_leader_is_replaced_and_its_counts_are_kept(replica: Replica) -> None:
    leader = replica.leader()
    assert leader is not None
    counted = metric_value(replica.gateway.base_url, "draftgate_requests_total")
    assert counted > 0
    os.kill(leader, signal.SIGKILL)
    wait_until(
        lambda: leader not in replica.workers() and len(replica.workers()) == WORKERS,
        "the dead worker started again",
    )
    wait_until(lambda: replica.leader() not in (None, leader), "another worker leads")
    assert metric_value(replica.gateway.base_url, "draftgate_requests_total") == counted
    ready = replica.state / GAUGES_FILE
    wait_until(
        lambda: "draftgate_ready 1.0" in httpx.get(f"{replica.gateway.base_url}/metrics").text,
        "the new leader publishes the replica's readiness",
    )
    assert ready.exists()
    methods = _send_until_every_worker_served(replica)
    wait_for_metric(replica.gateway.base_url, "draftgate_requests_total", counted + len(methods))


def test_an_admin_change_applies_on_every_worker_before_the_answer(replica: Replica) -> None:
    for method in ("p-eagle", "plain"):  # each pin differs from what was routed before it
        pinned = {"mode": "pinned", "method": method}
        with httpx.Client(base_url=replica.gateway.base_url, headers=ADMIN, timeout=10.0) as http:
            answer = http.put(
                f"/admin/v1/models/{SIM_MODEL}/policy", json=pinned, params={"immediate": "true"}
            )
        assert answer.status_code == 200, answer.text
        # At once, whichever worker took the change: none routes by the old policy.
        methods = _send_until_every_worker_served(replica)
        assert set(methods.values()) == {method}


def test_a_keys_concurrency_limit_holds_over_every_worker(
    start_module_servers: ModuleServerStarter, tmp_path: Path
) -> None:
    [slow] = start_module_servers(sim_args())  # in real time: a long answer holds its place
    fleet = write_fleet(tmp_path / "fleet.yaml", [fleet_backend("c-plain", slow.base_url)])
    state = tmp_path / "state"
    env = gateway_env(f"sqlite:///{tmp_path}/draftgate.db", fleet, WORKERS=str(WORKERS),
                      REQUIRE_API_KEY="true", WORKER_STATE_DIR=str(state))  # fmt: skip
    gateway = spawn_server(("gateway",), env, tmp_path)
    try:
        gateway.wait_healthy()
        replica = Replica(gateway, state, "", slow)
        wait_until(lambda: len(replica.workers()) == WORKERS, "both workers started")
        limited = {"name": "two-at-once", "max_concurrent_requests": 2}
        created = httpx.post(f"{gateway.base_url}/admin/v1/keys", headers=ADMIN, json=limited)
        assert created.status_code == 201, created.text  # every worker knows it now
        key = created.json()["key"]
        http = httpx.Client(limits=httpx.Limits(max_keepalive_connections=0), timeout=30.0)
        client = openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key=key, max_retries=0,
                               http_client=http)  # fmt: skip
        with client:
            held = [
                client.chat.completions.create(
                    model=SIM_MODEL,
                    messages=[{"role": "user", "content": "a long story"}],
                    max_tokens=4000,
                    stream=True,
                )
                for _ in range(2)
            ]
            for stream in held:
                next(iter(stream))  # admitted and answering
            refused = "concurrency_limit_exceeded"

            def every_worker_refused() -> bool:
                counted = replica.counted_by_pid("draftgate_rejections_total", reason=refused)
                return all(counted.get(pid, 0.0) > 0 for pid in replica.workers())

            # Whichever worker holds the two streams, at least one worker holds fewer than
            # two of them itself: its refusals count the other's.
            while not every_worker_refused():
                answer = http.post(
                    f"{gateway.base_url}/v1/chat/completions",
                    headers={"Authorization": f"Bearer {key}"},
                    json={"model": SIM_MODEL, "max_tokens": 1, "messages": MESSAGES},
                )
                assert answer.status_code == 429, answer.text
                assert answer.json()["error"]["code"] == refused
            for stream in held:
                stream.close()
            wait_for_metric(gateway.base_url, "draftgate_backend_in_flight", 0.0, timeout_s=30.0)
            before = replica.served_by_pid()
            while not all(replica.served_by_pid().get(pid, 0.0) > before.get(pid, 0.0)
                          for pid in replica.workers()):  # fmt: skip
                answer = client.chat.completions.create(
                    model=SIM_MODEL, messages=MESSAGES, max_tokens=1
                )
                assert answer.choices  # admitted again, on every worker
        http.close()
    finally:
        gateway.close()


def test_sigterm_stops_every_worker(
    start_module_servers: ModuleServerStarter, tmp_path: Path
) -> None:
    [plain] = start_module_servers(sim_args("--time-scale", "20"))
    fleet = write_fleet(tmp_path / "fleet.yaml", [fleet_backend("s-plain", plain.base_url)])
    env = gateway_env(f"sqlite:///{tmp_path}/draftgate.db", fleet, WORKERS=str(WORKERS))
    gateway = spawn_server(("gateway",), env, tmp_path)
    try:
        gateway.wait_healthy()
        running = Replica(gateway, tmp_path, "", plain)
        wait_until(lambda: len(running.workers()) == WORKERS, "both workers started")
        workers = running.workers()
        assert gateway.stop(signal.SIGTERM) == 0
        assert not [pid for pid in workers if Path(f"/proc/{pid}").exists()]
        assert "Finished server process" in gateway.output()
    finally:
        gateway.close()


CANNOT_START = """
import logging, sys
from gateway.server.workers import run_workers

def serve(sock, replica):
    sys.exit(3)  # what uvicorn exits with when the app's start-up fails

logging.basicConfig(level="INFO")
run_workers(2, "127.0.0.1", 0, None, serve)
"""


def test_a_worker_that_cannot_start_stops_the_replica_with_its_status() -> None:
    """Not started again every second for ever: the replica exits 3, as one process does."""
    done = subprocess.run(
        [sys.executable, "-c", CANNOT_START], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 3, done.stderr
    assert "could not start; stopping the replica" in done.stderr
    assert "starting it again" not in done.stderr


def test_a_state_directory_others_may_write_is_refused_before_anything(tmp_path: Path) -> None:
    """Another user's files there could steer the replica (its leader, its routing): the
    gateway names the directory and the fix, and exits before it makes a database."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    fleet = write_fleet(tmp_path / "fleet.yaml", [fleet_backend("w", "http://127.0.0.1:9")])
    env = gateway_env(
        f"sqlite:///{tmp_path}/draftgate.db", fleet, WORKERS="2", WORKER_STATE_DIR=str(shared)
    )
    done = subprocess.run(
        [str(DRAFTGATE), "gateway", "--port", str(free_port())],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert f"DRAFTGATE_WORKER_STATE_DIR: {shared} may be written by others" in done.stderr
    assert "chmod 700" in done.stderr
    assert not (tmp_path / "draftgate.db").exists()
    assert os.listdir(shared) == []
