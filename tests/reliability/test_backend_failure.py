"""Scenario 1: one of two backends of a model is SIGKILLed under c=64 streaming load.

Nothing that had not started streaming fails (it is retried on the other backend), every
stream the kill broke ends with an SSE error event, the prober takes the dead backend out
within a probe interval and puts it back once it runs again on the same port, and the ledger
holds exactly one record per client request. The long variant is
`bench/reliability_failover.py`.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.reliability.conftest import (
    Processes,
    Server,
    fleet_backend,
    metric_value,
    run_streaming_load,
    stream_body,
    stream_once,
    wait_for_ledger,
)

MODEL = "reliability/failover"
# Slower than real time: each stream spends about a second at its backend, so a kill finds
# streams in flight there even when the gateway and the client share a busy machine.
SIM_OPTIONS = ("--time-scale", "0.2")
MAX_TOKENS = 48
CONCURRENCY = 64
LOAD_S = 60.0  # an upper bound: the load stops AFTER_DETECTION_S after the backend is out
AFTER_DETECTION_S = 3.0
KILL_WHEN_RUNNING = 4  # streams in flight at the backend before it is killed
KILL_WAIT_S = 20.0
PROBE_INTERVAL_S = 1.0
# A busy machine may run the prober late; what is asserted is "about one interval".
DETECT_SLACK_S = 4.0
RETURN_TIMEOUT_S = 30.0


async def wait_healthy_gauge(gateway: Server, backend: str, value: int, timeout_s: float) -> float:
    """Seconds until the gateway's `draftgate_backend_healthy{backend}` reads `value`."""
    started = time.monotonic()
    while metric_value(gateway.base_url, "draftgate_backend_healthy", backend=backend) != value:
        if time.monotonic() - started > timeout_s:
            pytest.fail(f"{backend} healthy gauge not {value} after {timeout_s} s")
        await asyncio.sleep(0.05)
    return time.monotonic() - started


async def wait_running(sim: Server, count: int) -> None:
    """Until the simulator runs at least `count` requests."""
    deadline = time.monotonic() + KILL_WAIT_S
    async with httpx.AsyncClient(base_url=sim.base_url, timeout=5.0) as http:
        while True:
            families = text_string_to_metric_families((await http.get("/metrics")).text)
            samples = [s for f in families for s in f.samples]
            if sum(s.value for s in samples if s.name == "vllm:num_requests_running") >= count:
                return
            assert time.monotonic() < deadline, f"the backend never ran {count} requests"
            await asyncio.sleep(0.02)


async def test_sigkill_one_backend_under_streaming_load(
    database_url: str, processes: Processes
) -> None:
    first, second = (
        processes.sim(*SIM_OPTIONS, model=MODEL),
        processes.sim(*SIM_OPTIONS, model=MODEL),
    )
    fleet = [
        fleet_backend("fail-a", first.base_url, model=MODEL),
        fleet_backend("fail-b", second.base_url, model=MODEL),
    ]
    gateway = processes.gateway(
        database_url,
        fleet,
        PROBE_INTERVAL_S=str(PROBE_INTERVAL_S),
        BREAKER_COOLDOWN_S="2",
        COLLECT_INTERVAL_S="3600",
    )
    await wait_healthy_gauge(gateway, "fail-b", 1, RETURN_TIMEOUT_S)
    stop = asyncio.Event()
    load = asyncio.create_task(
        run_streaming_load(
            gateway.base_url,
            MODEL,
            concurrency=CONCURRENCY,
            duration_s=LOAD_S,
            prefix="kill",
            max_tokens=MAX_TOKENS,
            stop=stop,
        )
    )
    await wait_running(second, KILL_WHEN_RUNNING)
    second.process.kill()
    killed_at = time.monotonic()
    detect_s = await wait_healthy_gauge(gateway, "fail-b", 0, PROBE_INTERVAL_S + DETECT_SLACK_S)
    taken_out_at = time.monotonic()
    await asyncio.sleep(AFTER_DETECTION_S)
    stop.set()
    result = await load
    retried = metric_value(gateway.base_url, "draftgate_upstream_retries_total", model=MODEL)
    broken = [o for o in result.outcomes if o.kind == "broken_with_error"]
    late = [o for o in result.outcomes if o.started_at > taken_out_at]
    print(
        f"\nscenario 1 ({database_url.split(':')[0]}): c={CONCURRENCY} {result.summary()} "
        f"retried={retried:.0f} by_backend={dict(result.by_backend())} "
        f"detected_in={detect_s:.2f}s (probe interval {PROBE_INTERVAL_S}s) "
        f"sent_after_detection={len(late)}"
    )
    assert result.count("failed") == 0, [o for o in result.outcomes if o.kind == "failed"][:3]
    assert result.count("truncated") == 0  # a broken stream is never silently cut short
    assert broken, "the kill broke no stream: the test did not exercise a mid-stream failure"
    assert {o.backend for o in broken} == {"fail-b"}
    assert late
    assert all(o.backend == "fail-a" for o in late)  # taken out: nothing sent there since
    assert killed_at < taken_out_at

    restarted = processes.sim(*SIM_OPTIONS, model=MODEL, port=second.port)
    return_s = await wait_healthy_gauge(gateway, "fail-b", 1, RETURN_TIMEOUT_S)
    async with httpx.AsyncClient(base_url=gateway.base_url, timeout=30.0) as http:
        after = [await stream_once(http, stream_body(MODEL, 4), "kill") for _ in range(20)]
    print(f"restarted on port {restarted.port}: back in rotation after {return_s:.2f}s")
    assert all(o.kind == "ok" for o in after)
    assert "fail-b" in {o.backend for o in after}

    sent = result.request_ids + [o.request_id for o in after]
    counts = wait_for_ledger(database_url, "kill", sent)
    print(f"ledger records expected={len(sent)} found={sum(counts.values())}")
    assert set(counts) == set(sent)
    assert set(counts.values()) == {1}  # exactly one record per client request
