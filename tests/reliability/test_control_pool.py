"""Health checks have connections of their own: a full relay pool cannot starve them.

The relay's pool (`DRAFTGATE_UPSTREAM_MAX_CONNECTIONS`) is filled by requests a backend
holds open; meanwhile another backend comes up, and the prober must still see it.
"""

from __future__ import annotations

import asyncio
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import free_port
from tests.reliability.conftest import Processes, fleet_backend, metric_value, wait_for_health

MODEL = "reliability/pool"
POOL = 2
UP_TIMEOUT_S = 30.0


async def running(http: httpx.AsyncClient, sim: str) -> float:
    """Requests the simulator is generating now."""
    text = (await http.get(f"{sim}/metrics")).text
    families = text_string_to_metric_families(text)
    samples = [s for f in families for s in f.samples]
    return sum(s.value for s in samples if s.name == "vllm:num_requests_running")


async def test_a_full_relay_pool_does_not_starve_the_prober(
    database_url: str, processes: Processes
) -> None:
    holder = processes.sim("--time-scale", "0.02", model=MODEL)  # a request runs for minutes
    late_port = free_port()
    fleet = [
        fleet_backend("pool-holder", holder.base_url, model=MODEL),
        fleet_backend("pool-late", f"http://127.0.0.1:{late_port}", model=MODEL),
    ]
    gateway = processes.gateway(
        database_url, fleet, UPSTREAM_MAX_CONNECTIONS=str(POOL), PROBE_INTERVAL_S="0.5"
    )
    async with httpx.AsyncClient(timeout=60.0) as http:
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hold"}],
            "max_tokens": 4000,
            "ignore_eos": True,
        }
        held = [
            asyncio.create_task(http.post(f"{gateway.base_url}/v1/chat/completions", json=body))
            for _ in range(POOL)
        ]
        try:
            deadline = time.monotonic() + UP_TIMEOUT_S
            while await running(http, holder.base_url) < POOL:  # the relay's pool is full
                assert time.monotonic() < deadline, "the held requests never reached the sim"
                await asyncio.sleep(0.05)
            # Up, down, up again: three probe cycles at least, all with the relay's pool full.
            late = processes.sim("--time-scale", "50", model=MODEL, port=late_port)
            await wait_for_health(gateway.base_url, "pool-late", 1, deadline)
            late.process.kill()
            await wait_for_health(gateway.base_url, "pool-late", 0, deadline)
            processes.sim("--time-scale", "50", model=MODEL, port=late_port)
            await wait_for_health(gateway.base_url, "pool-late", 1, deadline)
            # The backend whose connections are all taken was probed all along (on the
            # relay's pool, its probes waited past their timeout and it was taken out).
            assert (
                metric_value(gateway.base_url, "draftgate_backend_healthy", backend="pool-holder")
                == 1
            )
            assert not any(t.done() for t in held)  # the pool stayed full all along
        finally:
            for task in held:
                task.cancel()
            await asyncio.gather(*held, return_exceptions=True)
