"""Scenario 2: backends that stall mid-stream or answer slowly.

A stall trips the read timeout (the stream ends with an SSE error event) and, repeated, the
circuit breaker; a stream slow to start is retried on another backend; meanwhile another
model on healthy backends is served as fast as before (no head-of-line blocking), and a few hundred
stalled requests leave no upstream connection, descriptor or memory behind.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.reliability.conftest import (
    ADMIN_TOKEN,
    Outcome,
    Server,
    connections_to,
    describe_fds,
    fleet_backend,
    gateway_env,
    metric_value,
    open_fds,
    rss_bytes,
    sim_args,
    spawn_server,
    stream_body,
    stream_once,
    write_fleet,
)

STALL_MODEL = "reliability/stall"  # a stalling backend beside a healthy one
SLOW_MODEL = "reliability/slow"  # a backend that answers after 30 s beside a healthy one
HEALTHY_MODEL = "reliability/healthy"
FAST = ("--time-scale", "10")
READ_TIMEOUT_S = 2  # short, yet a busy machine's healthy simulator answers well within it
BREAKER_FAILURES = 3
HOL_READ_TIMEOUT_S = 5  # a healthy request stuck behind a stall would take this long
STALLED_REQUESTS = 300
STALL_CONCURRENCY = 100
PROBES = 20
CLOSE_TIMEOUT_S = 30.0  # timed-out upstream connections close within this


@dataclass
class Sims:
    """The module's simulators."""

    stall: Server
    slow: Server
    ok: Server
    slow_ok: Server
    healthy: Server


@pytest.fixture(scope="module")
def sims(start_module_servers: Any) -> Sims:
    """A sim that stalls every stream, one that waits 30 s, and healthy ones."""
    stall, slow, ok, slow_ok, healthy = start_module_servers(
        sim_args(*FAST, "--stall-rate", "1", "--served-model-name", STALL_MODEL),
        sim_args(*FAST, "--delay-s", "30", "--served-model-name", SLOW_MODEL),
        sim_args(*FAST, "--served-model-name", STALL_MODEL),
        sim_args(*FAST, "--served-model-name", SLOW_MODEL),
        sim_args(*FAST, "--served-model-name", HEALTHY_MODEL),
    )
    return Sims(stall, slow, ok, slow_ok, healthy)


@pytest.fixture
def gateways(tmp_path: Any) -> Iterator[Any]:
    """Start `draftgate gateway` processes on fresh SQLite files; stopped in teardown."""
    started: list[Server] = []

    def start(backends: list[dict[str, object]], **settings: str) -> Server:
        fleet = write_fleet(tmp_path / f"fleet-{len(started)}.yaml", backends)
        # Probes at the default pace: their timeout, min(interval, 2 s), must not expire just
        # because the machine is busy; the breaker, not the prober, is under test here.
        settings = {"PROBE_INTERVAL_S": "5"} | settings
        env = gateway_env(f"sqlite:///{tmp_path}/gw-{len(started)}.db", fleet, **settings)
        server = spawn_server(("gateway",), env, tmp_path)
        started.append(server)
        server.wait_healthy()
        return server

    try:
        yield start
    finally:
        for server in started:
            server.close()


def runtime(gateway: Server, backend: str) -> dict[str, Any]:
    """The backend's runtime as the gateway's admin API shows it."""
    with gateway.client(ADMIN_TOKEN) as admin:
        response = admin.get(f"/admin/v1/backends/{backend}")
    assert response.status_code == 200, response.text
    value: dict[str, Any] = response.json()["runtime"]
    return value


async def streams(gateway: Server, model: str, count: int, concurrency: int) -> list[Outcome]:
    """`count` streaming requests of `model`, `concurrency` at a time."""
    limits = httpx.Limits(max_connections=concurrency)
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=gateway.base_url, timeout=60.0, limits=limits) as http:

        async def one() -> Outcome:
            async with gate:
                return await stream_once(http, stream_body(model, 16), "stall")

        return list(await asyncio.gather(*(one() for _ in range(count))))


async def wait_connections(pid: int, port: int, count: int, timeout_s: float = 30.0) -> int:
    """Until process `pid` holds `count` connections to `port` (stalls in flight); how many."""
    deadline = time.monotonic() + timeout_s
    while (held := connections_to(pid, [port])) < count:
        assert time.monotonic() < deadline, f"only {held} connections to the stalled backend"
        await asyncio.sleep(0.05)
    return held


async def settle(read: Callable[[], int], most: int, timeout_s: float = CLOSE_TIMEOUT_S) -> int:
    """Until `read()` is at most `most` (or the timeout): what it reads then. Closing is
    asynchronous on both sides of a socket, so a count taken at once can catch it midway."""
    deadline = time.monotonic() + timeout_s
    while (value := read()) > most:
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    return value


def median_latency_s(outcomes: list[Outcome]) -> float:
    """The median latency of requests that all succeeded."""
    assert [o.kind for o in outcomes] == ["ok"] * len(outcomes)
    return statistics.median(o.latency_s for o in outcomes)


async def test_a_stall_trips_the_read_timeout_then_the_breaker(sims: Sims, gateways: Any) -> None:
    gateway = gateways(
        [
            fleet_backend("stall-1", sims.stall.base_url, model=STALL_MODEL),
            fleet_backend("stall-ok", sims.ok.base_url, model=STALL_MODEL),
        ],
        READ_TIMEOUT_S=str(READ_TIMEOUT_S),
        BREAKER_FAILURES=str(BREAKER_FAILURES),
        BREAKER_COOLDOWN_S="300",
    )
    outcomes: list[Outcome] = []
    while not runtime(gateway, "stall-1")["circuit_open"]:
        assert len(outcomes) < 60, "the breaker never opened"
        outcomes += await streams(gateway, STALL_MODEL, 1, 1)
    broken = [o for o in outcomes if o.kind == "broken_with_error"]
    after = await streams(gateway, STALL_MODEL, 10, 2)
    retried = metric_value(gateway.base_url, "draftgate_upstream_retries_total", model=STALL_MODEL)
    print(
        f"\nscenario 2 stall: {len(outcomes)} requests until the breaker opened, "
        f"broken with error event={len(broken)} (read timeout {READ_TIMEOUT_S}s), "
        f"retried={retried:.0f}, "
        f"then {sum(o.kind == 'ok' for o in after)}/10 ok on {sorted({o.backend for o in after})}"
    )
    # Each stall counted, nothing reset the count (a stall before the first chunk, possible
    # when the machine is slow, is retried on the healthy backend and counts too).
    assert broken
    assert len(broken) + retried == BREAKER_FAILURES
    assert {o.backend for o in broken} == {"stall-1"}
    assert all(o.chunks > 0 for o in broken), broken  # cut mid-stream, not before
    # Ended by the read timeout (timers may fire a hair early across processes).
    assert {o.error_message for o in broken} == {"backend stream broke: ReadTimeout"}
    assert min(o.latency_s for o in broken) >= 0.9 * READ_TIMEOUT_S, broken
    assert [o.kind for o in outcomes if o not in broken] == ["ok"] * (len(outcomes) - len(broken))
    assert [(o.kind, o.backend) for o in after] == [("ok", "stall-ok")] * 10


def test_a_slow_backend_is_retried_elsewhere_then_skipped(sims: Sims, gateways: Any) -> None:
    gateway = gateways(
        [
            fleet_backend("slow-1", sims.slow.base_url, model=SLOW_MODEL),
            fleet_backend("slow-ok", sims.slow_ok.base_url, model=SLOW_MODEL),
        ],
        READ_TIMEOUT_S=str(READ_TIMEOUT_S),
        BREAKER_FAILURES=str(BREAKER_FAILURES),
        BREAKER_COOLDOWN_S="300",
    )
    served: list[tuple[int, str | None]] = []
    with gateway.client() as http:
        http.timeout = httpx.Timeout(30.0)
        while not runtime(gateway, "slow-1")["circuit_open"]:
            assert len(served) < 60, "the breaker never opened"
            # Each a conversation of its own, so affinity keys spread over both backends.
            chat = [{"role": "user", "content": f"hi {len(served)}"}]
            # A stream: vLLM heads one at once, so its silence is the backend's fault (a whole
            # response is headed only once generated: it is not retried, nor counted).
            body = {"model": SLOW_MODEL, "messages": chat, "max_tokens": 4, "stream": True}
            response = http.post("/v1/chat/completions", json=body)
            served.append((response.status_code, response.headers.get("x-draftgate-backend")))
    retried = metric_value(gateway.base_url, "draftgate_upstream_retries_total", model=SLOW_MODEL)
    print(f"\nscenario 2 slow: sent={len(served)} failed=0 retried={retried:.0f}")
    assert served == [(200, "slow-ok")] * len(served)  # every timeout retried, none failed
    assert retried == BREAKER_FAILURES


async def test_stalls_block_no_other_model_and_leak_nothing(sims: Sims, gateways: Any) -> None:
    gateway = gateways(
        [
            fleet_backend("only-stall", sims.stall.base_url, model=STALL_MODEL),  # nothing else
            fleet_backend("healthy-1", sims.healthy.base_url, model=HEALTHY_MODEL),
        ],
        READ_TIMEOUT_S=str(HOL_READ_TIMEOUT_S),
        BREAKER_FAILURES="1000000",  # every request reaches the stall
    )
    pid, stall_port = gateway.process.pid, sims.stall.port
    await streams(gateway, HEALTHY_MODEL, PROBES, 4)  # warm up: connections, code paths
    await streams(gateway, STALL_MODEL, 10, 10)
    before_s = median_latency_s(await streams(gateway, HEALTHY_MODEL, PROBES, 4))
    rss, fds = rss_bytes(pid), open_fds(pid)
    upstream = connections_to(pid, [stall_port])

    stalled = asyncio.create_task(
        streams(gateway, STALL_MODEL, STALLED_REQUESTS, STALL_CONCURRENCY)
    )
    in_stall = await wait_connections(pid, stall_port, STALL_CONCURRENCY // 2)
    during_s = median_latency_s(await streams(gateway, HEALTHY_MODEL, PROBES, 4))
    outcomes = await stalled
    upstream_after = await settle(lambda: connections_to(pid, [stall_port]), upstream + 2)
    fds_after = await settle(lambda: open_fds(pid), fds + 10)  # the clients' sockets too
    rss_after = rss_bytes(pid)
    kinds = [o.kind for o in outcomes]
    print(
        f"\nscenario 2 head-of-line: {HEALTHY_MODEL} median latency before={before_s * 1000:.0f}ms "
        f"during {STALL_CONCURRENCY} stalls={during_s * 1000:.0f}ms; stalled sent={len(kinds)} "
        f"broken with error event={kinds.count('broken_with_error')}; connections to the "
        f"stalled backend before={upstream} during={in_stall} after={upstream_after}; "
        f"fds before={fds} after={fds_after}; "
        f"RSS before={rss / 2**20:.1f}MB after={rss_after / 2**20:.1f}MB"
    )
    others = [o for o in outcomes if o.kind != "broken_with_error"]
    assert not others, others[:3]
    # No head-of-line blocking: one blocked request would wait the whole read timeout.
    assert during_s < min(3 * before_s + 1.0, HOL_READ_TIMEOUT_S / 2)
    assert upstream_after <= upstream + 2  # every timed-out connection was closed
    assert fds_after <= fds + 10, describe_fds(pid)
    assert rss_after - rss < 40 * 2**20  # loose: a leak per request would show in hundreds
