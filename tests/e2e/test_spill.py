"""Per-request burst spill through a real gateway: an `auto` model on P-EAGLE with an ITL
objective tight enough that its backend has room for only a few streams; a burst of
concurrent streams fills it, and the requests past its room are served by EAGLE-3 (the other
method, which still has room), each saying `x-draftgate-fallback: spill`, counted in
`draftgate_fallbacks_total{reason="spill"}`, and none refused. Without the objective's
pressure (one stream at a time) nothing spills."""

from __future__ import annotations

import asyncio
from collections import Counter

import httpx
import pytest

from tests.e2e.conftest import (
    ADMIN,
    SIM_MODEL,
    ModuleGatewayStarter,
    ModuleServerStarter,
    Server,
    fleet_backend,
    metric_value,
    price_gpu,
    sim_args,
    until,
)

WAIT_S = 60.0  # a deadline, not a wait
BURST = 16
ROOM = 4  # streams P-EAGLE's backend serves within the objective the test sets


@pytest.fixture(scope="module")
def gateway(
    start_module_servers: ModuleServerStarter, start_module_gateway: ModuleGatewayStarter
) -> Server:
    peagle, eagle3 = start_module_servers(
        sim_args("--method", "p-eagle", "--k", "7"), sim_args("--method", "eagle3", "--k", "3")
    )
    server, _ = start_module_gateway(
        [
            fleet_backend("spill-p-eagle", peagle.base_url, "p-eagle"),
            fleet_backend(
                "spill-eagle3",
                eagle3.base_url,
                "eagle3",
                k=3,
                drafter="RedHatAI/gpt-oss-20b-speculator.eagle3",
            ),
        ],
        SELECTOR_INTERVAL_S="0.5",
    )
    price_gpu(server, ["p-eagle", "eagle3"])
    lines = _lines(server)
    # ITL = streams / tokens/s: just above P-EAGLE's at ROOM streams, and EAGLE-3's at one
    itl = {m: {c: 1000 * c / tps for c, tps in points} for m, points in lines.items()}
    objective = 1.05 * max(itl["p-eagle"][ROOM], itl["eagle3"][1])
    assert itl["p-eagle"][2 * ROOM] > objective  # P-EAGLE's room is below the burst
    policy = {"mode": "auto", "itl_objective_ms": round(objective, 3)}
    answer = httpx.put(
        f"{server.base_url}/admin/v1/models/{SIM_MODEL}/policy", json=policy, headers=ADMIN
    )
    assert answer.status_code == 200, answer.text
    until(lambda: _routed(server) == "p-eagle", "auto on P-EAGLE at low load")
    return server


def _lines(gateway: Server) -> dict[str, list[tuple[float, float]]]:
    curves = httpx.get(
        f"{gateway.base_url}/admin/v1/curves", params={"model": SIM_MODEL}, headers=ADMIN
    ).json()["curves"]
    return {
        c["method"]: [(p["concurrency"], p["output_tokens_per_s"]) for p in c["line"]]
        for c in curves
    }


def _routed(gateway: Server) -> str:
    answer = httpx.post(
        f"{gateway.base_url}/v1/chat/completions",
        json={"model": SIM_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
        timeout=30,
    )
    answer.raise_for_status()
    return answer.headers["x-draftgate-method"]


async def _burst(gateway: Server, streams: int) -> list[tuple[str, str | None]]:
    """`streams` streamed answers at once; (method, fallback) of each, read once whole."""
    body = {
        "model": SIM_MODEL,
        "messages": [{"role": "user", "content": "tell me a long story"}],
        "max_tokens": 512,
        "stream": True,
        "ignore_eos": True,
    }
    started = asyncio.Event()
    opened = 0

    async def one(http: httpx.AsyncClient) -> tuple[str, str | None]:
        nonlocal opened
        async with http.stream("POST", "/v1/chat/completions", json=body) as answer:
            assert answer.status_code == 200, await answer.aread()
            opened += 1
            if opened == streams:
                started.set()
            # every stream holds its backend until all are routed
            await asyncio.wait_for(started.wait(), WAIT_S)
            async for _ in answer.aiter_bytes():
                pass
            return answer.headers["x-draftgate-method"], answer.headers.get("x-draftgate-fallback")

    limits = httpx.Limits(max_connections=streams + 2)
    async with httpx.AsyncClient(base_url=gateway.base_url, limits=limits, timeout=120) as http:
        return await asyncio.gather(*(one(http) for _ in range(streams)))


def _spills(gateway: Server) -> float:
    return metric_value(
        gateway.base_url, "draftgate_fallbacks_total", model=SIM_MODEL, reason="spill"
    )


def test_a_burst_past_the_room_within_the_objective_spills_to_the_other_method(
    gateway: Server,
) -> None:
    before = _spills(gateway)
    answers = asyncio.run(_burst(gateway, BURST))
    served = Counter(answers)
    spilled = served[("eagle3", "spill")]
    assert spilled >= 1, served
    assert served[("p-eagle", None)] >= ROOM, served  # the chosen method kept its room
    assert set(served) <= {("p-eagle", None), ("eagle3", "spill")}, served
    assert _spills(gateway) - before == spilled


def test_one_stream_at_a_time_never_spills(gateway: Server) -> None:
    before = _spills(gateway)
    for _ in range(3):
        assert asyncio.run(_burst(gateway, 1)) == [("p-eagle", None)]
    assert _spills(gateway) == before
