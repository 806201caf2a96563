"""Scenario 4: SIGTERM under streaming load, and a restart on the same database.

On SIGTERM the gateway refuses new connections at once, lets the streams in flight finish
within `DRAFTGATE_SHUTDOWN_GRACE_S`, ends any still running after it with an SSE error
event, writes every usage record and exits 0. A restart on the same database serves the
same backends, policies, keys and prices.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import time
import uuid
from typing import Any

import httpx
import pytest

from tests.reliability.conftest import (
    ADMIN_TOKEN,
    Outcome,
    Processes,
    Server,
    fleet_backend,
    query_rows,
    stream_body,
    stream_once,
)

MODEL = "reliability/shutdown"
SIM_OPTIONS = ("--time-scale", "0.2")  # slower than real time: streams last seconds
STREAMS = 32
MAX_TOKENS = 128  # seconds per stream: all are still running when SIGTERM arrives
GRACE_S = 30
SHORT_GRACE_S = 1
START_TIMEOUT_S = 30.0
EXIT_SLACK_S = 15.0  # a busy machine may be slow to tear down
# Records reach the database only through the flush at shutdown, not the periodic one.
NO_PERIODIC_FLUSH = {"LEDGER_FLUSH_INTERVAL_S": "3600"}


def refuses_connections(port: int) -> bool:
    """Nothing accepts a TCP connection on 127.0.0.1:`port`."""
    with socket.socket() as sock:
        sock.settimeout(2.0)
        return sock.connect_ex(("127.0.0.1", port)) != 0


async def start_streams(gateway: Server, count: int, max_tokens: int) -> list[asyncio.Task[Any]]:
    """`count` streams through the gateway, returned once each has received a chunk."""
    outcomes = [Outcome(request_id=f"term-{uuid.uuid4().hex[:16]}") for _ in range(count)]
    limits = httpx.Limits(max_connections=count)
    http = httpx.AsyncClient(base_url=gateway.base_url, timeout=60.0, limits=limits)

    async def one(outcome: Outcome) -> Outcome:
        return await stream_once(http, stream_body(MODEL, max_tokens), outcome=outcome)

    tasks = [asyncio.create_task(one(o)) for o in outcomes]
    deadline = time.monotonic() + START_TIMEOUT_S
    while sum(o.chunks > 0 for o in outcomes) < count:
        assert time.monotonic() < deadline, "not every stream started"
        assert not any(t.done() for t in tasks), "a stream ended before SIGTERM"
        await asyncio.sleep(0.02)
    closer = asyncio.create_task(_close_after(http, tasks))
    return [*tasks, closer]


async def _close_after(http: httpx.AsyncClient, tasks: list[asyncio.Task[Any]]) -> None:
    await asyncio.gather(*tasks)
    await http.aclose()


async def wait_exit(server: Server, timeout_s: float) -> int:
    """The process's exit code, waited for without blocking the event loop."""
    deadline = time.monotonic() + timeout_s
    while (code := server.process.poll()) is None:
        if time.monotonic() > deadline:
            pytest.fail(f"the gateway did not exit within {timeout_s} s of SIGTERM")
        await asyncio.sleep(0.05)
    return code


def ledger_rows(database_url: str, request_ids: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Usage records of `request_ids`, grouped by id."""
    rows = query_rows(database_url, "SELECT * FROM usage_records")
    found: dict[str, list[dict[str, Any]]] = {rid: [] for rid in request_ids}
    for row in rows:
        if row["client_request_id"] in found:
            found[row["client_request_id"]].append(row)
    return found


def shutdown_fleet(processes: Processes) -> list[dict[str, object]]:
    """Two slow simulators of MODEL, as fleet entries."""
    sims = [processes.sim(*SIM_OPTIONS, model=MODEL) for _ in range(2)]
    return [fleet_backend(f"term-{i}", s.base_url, model=MODEL) for i, s in enumerate(sims)]


async def test_sigterm_finishes_streams_in_flight_and_flushes_the_ledger(
    database_url: str, processes: Processes
) -> None:
    gateway = processes.gateway(
        database_url,
        shutdown_fleet(processes),
        SHUTDOWN_GRACE_S=str(GRACE_S),
        **NO_PERIODIC_FLUSH,
    )
    tasks = await start_streams(gateway, STREAMS, MAX_TOKENS)
    gateway.process.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    while not refuses_connections(gateway.port):
        assert time.monotonic() - signalled < 5.0, "still accepting connections after SIGTERM"
        await asyncio.sleep(0.05)
    refused_after_s = time.monotonic() - signalled
    outcomes: list[Outcome] = [o for o in await asyncio.gather(*tasks) if o is not None]
    code = await wait_exit(gateway, GRACE_S + EXIT_SLACK_S)
    exit_s = time.monotonic() - signalled
    ids = [o.request_id for o in outcomes]
    records = ledger_rows(database_url, ids)
    found = sum(len(r) for r in records.values())
    kinds = [o.kind for o in outcomes]
    print(
        f"\nscenario 4 ({database_url.split(':')[0]}): streams in flight at SIGTERM={STREAMS} "
        f"finished ok={kinds.count('ok')} refused new connections after {refused_after_s:.2f}s "
        f"exit code={code} after {exit_s:.2f}s (grace {GRACE_S}s) "
        f"records expected={len(ids)} found={found}"
    )
    assert kinds == ["ok"] * STREAMS  # every stream in flight ran to [DONE]
    assert code == 0
    assert all(len(r) == 1 for r in records.values())  # flushed at exit, exactly once each
    assert {(r[0]["status_code"], r[0]["outcome"]) for r in records.values()} == {(200, "ok")}
    assert all(r[0]["completion_tokens"] == MAX_TOKENS for r in records.values())


async def test_streams_beyond_the_grace_period_end_with_an_error_event(
    processes: Processes, tmp_path: Any
) -> None:
    database_url = f"sqlite:///{tmp_path}/grace.db"
    gateway = processes.gateway(
        database_url,
        shutdown_fleet(processes),
        SHUTDOWN_GRACE_S=str(SHORT_GRACE_S),
        **NO_PERIODIC_FLUSH,
    )
    tasks = await start_streams(gateway, 4, max_tokens=5000)  # minutes of generation
    gateway.process.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    outcomes: list[Outcome] = [o for o in await asyncio.gather(*tasks) if o is not None]
    code = await wait_exit(gateway, SHORT_GRACE_S + EXIT_SLACK_S)
    exit_s = time.monotonic() - signalled
    records = ledger_rows(database_url, [o.request_id for o in outcomes])
    print(
        f"\ngrace {SHORT_GRACE_S}s: {[o.kind for o in outcomes]} exit code={code} "
        f"after {exit_s:.2f}s, records={sum(len(r) for r in records.values())}"
    )
    assert [o.kind for o in outcomes] == ["broken_with_error"] * 4  # never silently truncated
    assert code == 0
    assert all(len(r) == 1 for r in records.values())
    assert {(r[0]["status_code"], r[0]["outcome"]) for r in records.values()} == {(503, "shutdown")}


CONFIG_READS = (
    "/admin/v1/backends",
    "/admin/v1/models",
    "/admin/v1/keys",
    "/admin/v1/prices",
    "/admin/v1/models/reliability/added/policy",
)


def without_runtime(value: Any) -> Any:
    """`value` with every `runtime` field removed (what this process sees, not config)."""
    if isinstance(value, dict):
        return {k: without_runtime(v) for k, v in value.items() if k != "runtime"}
    if isinstance(value, list):
        return [without_runtime(v) for v in value]
    return value


def configure(admin: httpx.Client, sim_url: str) -> str:
    """Add a backend, a model policy, an API key and a price; the key's secret."""
    backend = {"name": "added-1", "url": sim_url, "model": "reliability/added", "method": "plain"}
    policy = {"mode": "pinned", "method": "plain", "explore_fraction": 0.1}
    price = {"gpu_type": "H100", "usd_per_gpu_hour": 2.5, "source": "test", "date": "2026-11-01"}
    calls = [
        admin.post("/admin/v1/backends", json=backend),
        admin.put("/admin/v1/models/reliability/added/policy", json=policy),
        admin.post("/admin/v1/prices", json=price),
        key := admin.post("/admin/v1/keys", json={"name": "restart", "requests_per_minute": 600}),
    ]
    for response in calls:
        assert response.status_code in (200, 201), response.text
    secret: str = key.json()["key"]
    return secret


def read_config(gateway: Server) -> dict[str, Any]:
    """Every configuration read of the admin API, runtime fields dropped."""
    with gateway.client(ADMIN_TOKEN) as admin:
        responses = {path: admin.get(path) for path in CONFIG_READS}
    for path, response in responses.items():
        assert response.status_code == 200, (path, response.text)
    return {path: without_runtime(r.json()) for path, r in responses.items()}


def chat_with_key(gateway: Server, secret: str | None) -> httpx.Response:
    """One short chat to the added model, with `secret` as the bearer key if given."""
    body = {"model": "reliability/added", "messages": [{"role": "user", "content": "hi"}]}
    with gateway.client(secret) as http:
        return http.post("/v1/chat/completions", json=body | {"max_tokens": 4})


def test_a_restart_on_the_same_database_keeps_the_configuration(
    database_url: str, processes: Processes
) -> None:
    sim = processes.sim("--time-scale", "10", model="reliability/added")
    fleet = [fleet_backend("fleet-1", sim.base_url, model="reliability/added")]
    settings = {"REQUIRE_API_KEY": "true", "SHUTDOWN_GRACE_S": "5"}
    gateway = processes.gateway(database_url, fleet, **settings)
    with gateway.client(ADMIN_TOKEN) as admin:
        secret = configure(admin, sim.base_url)
    before = read_config(gateway)
    assert chat_with_key(gateway, secret).status_code == 200
    assert gateway.stop(signal.SIGTERM, timeout_s=5 + EXIT_SLACK_S) == 0

    restarted = processes.gateway(database_url, fleet, port=gateway.port, **settings)
    after = read_config(restarted)
    counts = {p: len(v["data"]) for p, v in after.items() if "data" in v}
    print(f"\nrestart ({database_url.split(':')[0]}): the same after a restart: {counts}")
    assert after == before
    assert counts["/admin/v1/backends"] == 2  # the fleet's and the one added through the API
    assert after[CONFIG_READS[-1]]["mode"] == "pinned"
    assert chat_with_key(restarted, secret).status_code == 200  # the key's hash survived
    assert chat_with_key(restarted, None).status_code == 401
