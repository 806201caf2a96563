"""Scenario 16: a pool member's pod is evicted under c=16 streaming load: SIGKILLed and its
address taken out of the pool's DNS name at once (the EndpointSlice update of an eviction).

Nothing that had not started streaming fails (it is retried on another member), every
stream the kill broke ends with an SSE error event, the member is removed by discovery and
takes no request after, and the ledger holds exactly one record per client request.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import DATABASES
from tests.e2e.test_pools import NAME, Fleet, dns_fleet, ready_members
from tests.e2e.test_pools import _wait as wait_for
from tests.reliability.conftest import run_streaming_load, wait_for_ledger

MEMBERS = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
# Slower than real time: each stream spends about a second at its member, so the kill
# finds streams in flight there even on a busy machine.
SIM_OPTIONS = ("--time-scale", "0.2", "--gpu", "B200")
CONCURRENCY = 16
MAX_TOKENS = 48
KILL_WHEN_RUNNING = 2  # streams in flight at the member before its pod is evicted
AFTER_REMOVAL_S = 3.0
WAIT_S = 30.0
SETTINGS = {"PROBE_INTERVAL_S": "1", "BREAKER_COOLDOWN_S": "2", "COLLECT_INTERVAL_S": "3600"}


@pytest.fixture(params=DATABASES)
def fleet(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    with contextlib.ExitStack() as stack:
        directory = tmp_path_factory.mktemp(f"pool-loss-{request.param}")
        fleet = dns_fleet(stack, request.param, directory, MEMBERS, SIM_OPTIONS, **SETTINGS)
        fleet.start_gateway()
        yield fleet


async def wait_running(url: str, count: int) -> None:
    """Until the simulator at `url` runs at least `count` requests."""
    deadline = time.monotonic() + WAIT_S
    async with httpx.AsyncClient(base_url=url, timeout=5.0) as http:
        while True:
            families = text_string_to_metric_families((await http.get("/metrics")).text)
            samples = [s for f in families for s in f.samples]
            if sum(s.value for s in samples if s.name == "vllm:num_requests_running") >= count:
                return
            assert time.monotonic() < deadline, f"the member never ran {count} requests"
            await asyncio.sleep(0.02)


async def test_an_evicted_member_fails_no_request_that_had_not_started(fleet: Fleet) -> None:
    gateway = fleet.gateway
    assert gateway is not None
    wait_for(lambda: len(fleet.members()) == len(MEMBERS), "three members")
    # in the database is not yet in the gateway's snapshot: wait until it routes to all three
    wait_for(lambda: ready_members(gateway) == len(MEMBERS), "three members routed")
    doomed_address = MEMBERS[1]
    doomed = f"sims:{doomed_address}:{fleet.port}"
    stop = asyncio.Event()
    load = asyncio.create_task(
        run_streaming_load(
            gateway.base_url,
            "openai/gpt-oss-20b",
            concurrency=CONCURRENCY,
            duration_s=120,
            prefix="evict",
            max_tokens=MAX_TOKENS,
            stop=stop,
        )
    )
    await wait_running(f"http://{doomed_address}:{fleet.port}", KILL_WHEN_RUNNING)
    fleet.sims[doomed_address].process.kill()
    await asyncio.to_thread(fleet.dns.set, NAME, [a for a in MEMBERS if a != doomed_address])
    await asyncio.to_thread(wait_for, lambda: doomed not in fleet.members(), "member removed")
    removed_at = time.monotonic()
    await asyncio.sleep(AFTER_REMOVAL_S)  # load goes on over the two members left
    stop.set()
    result = await load
    broken = [o for o in result.outcomes if o.kind == "broken_with_error"]
    late = [o for o in result.outcomes if o.started_at > removed_at]
    print(
        f"\nscenario 16: c={CONCURRENCY} {result.summary()} by_backend="
        f"{dict(result.by_backend())} sent_after_removal={len(late)}"
    )
    assert result.count("failed") == 0, [o for o in result.outcomes if o.kind == "failed"][:3]
    assert result.count("truncated") == 0
    assert broken, "the kill broke no stream: the test did not exercise a mid-stream loss"
    assert {o.backend for o in broken} == {doomed}
    assert late
    assert doomed not in {o.backend for o in late}
    counts = wait_for_ledger(fleet.database_url, "evict", result.request_ids)
    assert set(counts) == set(result.request_ids)
    assert set(counts.values()) == {1}  # exactly one record per client request
