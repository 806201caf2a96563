"""The autoscaling signal through a real gateway and simulators: `draftgate_desired_replicas`
rises with the streams in flight on the routed pool and falls back when they end."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import httpx
import pytest

from tests.e2e.conftest import (
    ADMIN_TOKEN,
    SIM_MODEL,
    ModuleGatewayStarter,
    ModuleServerStarter,
    Server,
    fleet_backend,
    metric_value,
    sim_args,
)

STREAMS = 32
WAIT_S = 30.0
# At 2 ms per token a p-eagle replica of GPT-OSS-20B on a B200 serves about 7500 tokens/s
# (15 streams, the planner's curve); 32 streams make about 11600 tokens/s, which with 20%
# headroom needs two replicas. No measurements are collected (one scrape an hour), so the
# curves are the planner's, whatever speed this machine runs the simulators at.
POLICY = {"mode": "pinned", "method": "p-eagle", "itl_objective_ms": 2.0}
SETTINGS = {
    "SELECTOR_INTERVAL_S": "0.2",
    "COLLECT_INTERVAL_S": "3600",
    "IDLE_POOL_REPLICAS": "0",
}


def _desired(server: Server, method: str) -> float:
    labels = {"model": SIM_MODEL, "method": method}
    return metric_value(server.base_url, "draftgate_desired_replicas", **labels)


def _wait(server: Server, method: str, check: Callable[[float], bool], what: str) -> float:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        seen = _desired(server, method)
        if check(seen):
            return seen
        time.sleep(0.2)
    pytest.fail(f"desired replicas of {method} never {what}: {_desired(server, method)}")


class Streams:
    """`STREAMS` long streamed completions held open until `stop`."""

    def __init__(self, base_url: str) -> None:
        self.base_url, self.stop = base_url, threading.Event()
        self._pool = ThreadPoolExecutor(1)
        self._done: Future[None] = self._pool.submit(asyncio.run, self._run())

    async def _run(self) -> None:
        limits = httpx.Limits(max_connections=STREAMS + 2)
        async with httpx.AsyncClient(base_url=self.base_url, limits=limits, timeout=60) as http:
            tasks = [asyncio.create_task(self._one(http)) for _ in range(STREAMS)]
            await asyncio.to_thread(self.stop.wait)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _one(self, http: httpx.AsyncClient) -> None:
        body = {
            "model": SIM_MODEL,
            "messages": [{"role": "user", "content": "go"}],
            "max_tokens": 4000,
            "ignore_eos": True,
            "stream": True,
        }
        while True:  # a stream that ends is replaced, so STREAMS stay in flight
            async with http.stream("POST", "/v1/chat/completions", json=body) as response:
                async for _ in response.aiter_bytes():
                    pass

    def close(self) -> None:
        self.stop.set()
        self._done.result(timeout=60)
        self._pool.shutdown()


@pytest.fixture(scope="module")
def gateway(
    start_module_servers: ModuleServerStarter, start_module_gateway: ModuleGatewayStarter
) -> Server:
    slow = ("--time-scale", "0.1", "--gpu", "B200")  # few tokens: little work for the machine
    peagle, plain = start_module_servers(
        sim_args("--method", "p-eagle", "--k", "7", *slow), sim_args(*slow)
    )
    backends = [
        fleet_backend("sim-peagle", peagle.base_url, "p-eagle", gpu_type="B200"),
        fleet_backend("sim-plain", plain.base_url, gpu_type="B200"),
    ]
    server, _ = start_module_gateway(
        backends, models=[{"name": SIM_MODEL, "policy": POLICY}], **SETTINGS
    )
    return server


def test_desired_replicas_follow_the_streams_in_flight(gateway: Server) -> None:
    assert _wait(gateway, "p-eagle", lambda n: n == 1, "1 at idle") == 1  # the floor
    assert _desired(gateway, "plain") == 0  # not routed to: DRAFTGATE_IDLE_POOL_REPLICAS
    streams = Streams(gateway.base_url)
    try:
        peak = _wait(gateway, "p-eagle", lambda n: n >= 2, "rose to 2 or more")
        with httpx.Client(base_url=gateway.base_url, timeout=10) as admin:
            admin.headers["Authorization"] = f"Bearer {ADMIN_TOKEN}"
            fleet = admin.get("/admin/v1/fleet", params={"model": SIM_MODEL}).json()
    finally:
        streams.close()
    now = fleet["now"]
    assert now["routed_method"] == "p-eagle"
    assert now["desired_replicas"]["plain"] == 0
    assert now["desired_replicas"]["p-eagle"] >= 2
    assert now["concurrency"] > STREAMS / 2  # smoothed towards the streams in flight
    assert peak <= 4  # 32 streams never need more than ceil(1.2 * 16600 / 7500) = 3 (+1 slack)
    _wait(gateway, "p-eagle", lambda n: n == 1, "fell back to 1 after the streams ended")
