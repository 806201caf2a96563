"""Scenario 10: poison requests beside good traffic.

A request every backend fails (here a prompt the simulators are told to answer with a 500,
as an engine bug would) is the request's fault, not the backends': once two backends seen
serving other requests meanwhile fail it alike, or every backend its route tried did, it is
answered 502 `request_failed_on_backends`, not retried further and not counted against any
breaker. So 100 of them beside c=32 good streams fail no good request, open no breaker (no
panic routing) and never make `/ready` answer 503. Two sick backends failing a good request
alike prove nothing: the healthy third still serves it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter

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


SICK_RUNS = 60
SICK_AT_ONCE = 6


async def test_two_sick_backends_do_not_make_a_request_poison(
    database_url: str, processes: Processes
) -> None:
    """Two backends answering every request 500 (as a broken engine would, with the same
    error a poison request gets) and one healthy: a request both sick ones fail alike still
    goes to the healthy third, so no good request fails. The breaker is held off (a failure
    threshold out of reach) so every request meets the sick ones, first (they answer at once,
    so they are the least loaded): before, every one of them got a poison verdict, 502."""
    sims = [processes.sim("--time-scale", "5", model=MODEL) for _ in range(3)]
    fleet = [fleet_backend(f"sick-{i}", s.base_url, model=MODEL) for i, s in enumerate(sims)]
    gateway = processes.gateway(database_url, fleet, BREAKER_FAILURES="1000")
    async with httpx.AsyncClient(timeout=30.0) as http:
        for sim in sims[:2]:
            told = await http.post(f"{sim.base_url}/sim/faults", json={"error_rate": 1.0})
            assert told.status_code == 200

        async def good() -> httpx.Response:
            body = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}],
                    "max_tokens": 4}  # fmt: skip
            return await http.post(f"{gateway.base_url}/v1/chat/completions", json=body)

        answers: list[httpx.Response] = []
        for _ in range(SICK_RUNS // SICK_AT_ONCE):
            answers += await asyncio.gather(*(good() for _ in range(SICK_AT_ONCE)))
    statuses = Counter(a.status_code for a in answers)
    backends = Counter(a.headers.get("x-draftgate-backend") for a in answers)
    retries = metric_value(gateway.base_url, "draftgate_upstream_retries_total", model=MODEL)
    poisoned = metric_value(gateway.base_url, "draftgate_poison_requests_total", model=MODEL)
    print(f"\ntwo sick backends and one healthy ({database_url.split(':')[0]}): {SICK_RUNS} "
          f"requests: {dict(statuses)} served by {dict(backends)}; retried {retries:.0f}, "
          f"poison verdicts {poisoned:.0f}")  # fmt: skip
    assert statuses == {200: SICK_RUNS}, [a.text for a in answers if a.status_code != 200][:3]
    assert backends == {"sick-2": SICK_RUNS}
    assert retries > 0  # the sick ones were met
    assert poisoned == 0
