"""Scenario 10: poison requests beside good traffic.

A request every backend fails (here a prompt the simulators are told to answer with a 500,
as an engine bug would) is the request's fault, not the backends': after a second backend
fails it alike it is answered 502 `request_failed_on_backends`, not retried further and not
counted against any breaker. So 100 of them beside c=32 good streams fail no good request,
open no breaker (no panic routing) and never make `/ready` answer 503.
"""

from __future__ import annotations

import asyncio
import uuid

import httpx

from tests.reliability.conftest import Processes, fleet_backend, metric_value, run_streaming_load

MODEL = "reliability/poison"
CONCURRENCY = 32
POISON = 100
POISON_AT_ONCE = 10


async def test_poison_requests_beside_good_traffic(database_url: str, processes: Processes) -> None:
    sims = [processes.sim("--time-scale", "5", model=MODEL) for _ in range(2)]
    fleet = [fleet_backend(f"poison-{i}", s.base_url, model=MODEL) for i, s in enumerate(sims)]
    gateway = processes.gateway(database_url, fleet, BREAKER_FAILURES="5", BREAKER_COOLDOWN_S="10")
    marker = f"poison-{uuid.uuid4().hex[:8]}"
    async with httpx.AsyncClient() as http:
        for sim in sims:
            told = await http.post(f"{sim.base_url}/sim/faults", json={"poison": marker})
            assert told.status_code == 200

    stop, ready = asyncio.Event(), []
    load = asyncio.create_task(
        run_streaming_load(
            gateway.base_url, MODEL, concurrency=CONCURRENCY, duration_s=120, prefix="poison",
            stop=stop,
        )
    )  # fmt: skip
    async with httpx.AsyncClient(base_url=gateway.base_url, timeout=30.0) as http:

        async def watch_ready() -> None:
            while not stop.is_set():
                ready.append((await http.get("/ready")).status_code)
                await asyncio.sleep(0.1)

        async def poison() -> httpx.Response:
            body = {"model": MODEL, "messages": [{"role": "user", "content": marker}]}
            return await http.post("/v1/chat/completions", json=body)

        watcher = asyncio.create_task(watch_ready())
        answers = []
        for _ in range(POISON // POISON_AT_ONCE):
            answers += await asyncio.gather(*(poison() for _ in range(POISON_AT_ONCE)))
        stop.set()
        await watcher
    result = await load
    panics = metric_value(gateway.base_url, "draftgate_panic_routes_total", model=MODEL)
    poisoned = metric_value(gateway.base_url, "draftgate_poison_requests_total", model=MODEL)
    codes = {(a.status_code, a.json()["error"]["code"]) for a in answers}
    print(
        f"\nscenario 10 ({database_url.split(':')[0]}): {POISON} poison requests beside "
        f"c={CONCURRENCY} good streams: {result.summary()} poison answers={codes} "
        f"counted={poisoned:.0f} panic_routes={panics:.0f} /ready={sorted(set(ready))} "
        f"({len(ready)} polls)"
    )
    assert codes == {(502, "request_failed_on_backends")}
    assert poisoned == POISON
    assert result.count("ok") > 0
    assert result.count("failed") == 0, [o for o in result.outcomes if o.kind == "failed"][:3]
    assert panics == 0  # no breaker opened: every good request found a closed one
    assert set(ready) == {200}
