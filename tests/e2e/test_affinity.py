"""Cache affinity end to end: a real gateway in front of three plain simulators of one model.

A conversation's turns all reach one backend, conversations spread evenly over the three, a
session moves to its next choice while its backend is past its load bound and comes back
after, and the simulators' prefix caches (vLLM's counters) show what that buys. The official
openai client talks to the gateway; the sims run at time scale 1 so a long stream stays in
flight while the test looks."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.e2e.conftest import (
    SIM_MODEL,
    ModuleGatewayStarter,
    ModuleServerStarter,
    Server,
    fleet_backend,
    metric_value,
    sim_args,
    wait_for_metric,
)

NAMES = ("sim-a", "sim-b", "sim-c")
SYSTEM = {"role": "system", "content": "You answer in one line. " * 60}


@pytest.fixture(scope="module")
def fleet(
    start_module_servers: ModuleServerStarter, start_module_gateway: ModuleGatewayStarter
) -> tuple[Server, dict[str, Server]]:
    sims = start_module_servers(*(sim_args() for _ in NAMES))
    backends = [fleet_backend(n, s.base_url) for n, s in zip(NAMES, sims, strict=True)]
    gateway, _ = start_module_gateway(backends)
    return gateway, dict(zip(NAMES, sims, strict=True))


@pytest.fixture(scope="module")
def client(fleet: tuple[Server, dict[str, Server]]) -> Iterator[openai.OpenAI]:
    gateway, _ = fleet
    with openai.OpenAI(
        base_url=f"{gateway.base_url}/v1", api_key="unused", max_retries=0, timeout=30.0
    ) as c:
        yield c


def ask(
    client: openai.OpenAI, messages: list[dict[str, str]], **headers: str
) -> tuple[str, str | None, str]:
    """One short chat turn: (backend, affinity outcome, the reply)."""
    raw = client.chat.completions.with_raw_response.create(
        model=SIM_MODEL,
        messages=messages,
        max_tokens=6,
        extra_headers=headers,  # type: ignore[arg-type]
    )
    reply = raw.parse().choices[0].message.content or ""
    return raw.headers["x-draftgate-backend"], raw.headers.get("x-draftgate-affinity"), reply


def converse(client: openai.OpenAI, opening: str, turns: int) -> list[str]:
    """A conversation of `turns` turns, each repeating all before it; the backends served."""
    messages = [SYSTEM, {"role": "user", "content": opening}]
    served = []
    for i in range(turns):
        backend, outcome, reply = ask(client, messages)
        assert outcome == "home"
        served.append(backend)
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": f"{i}?"}]
    return served


def cache_counters(sims: dict[str, Server]) -> tuple[float, float]:
    """Σ vllm:prefix_cache_queries and hits over the simulators."""
    queries = sum(
        metric_value(s.base_url, "vllm:prefix_cache_queries_total") for s in sims.values()
    )
    hits = sum(metric_value(s.base_url, "vllm:prefix_cache_hits_total") for s in sims.values())
    return queries, hits


def test_a_conversation_sticks_to_one_backend_and_finds_its_prefix_cached(
    fleet: tuple[Server, dict[str, Server]], client: openai.OpenAI
) -> None:
    _, sims = fleet
    queries, hits = cache_counters(sims)
    homes = [set(converse(client, f"Conversation {n}: where do we start?", 4)) for n in range(12)]
    assert all(len(served) == 1 for served in homes)
    assert len(set.union(*homes)) >= 2  # twelve conversations do not all share one home
    queries_after, hits_after = cache_counters(sims)
    # Turns 2-4 find the turn before cached; turn 1 finds the system prompt once per backend.
    assert (hits_after - hits) / (queries_after - queries) > 0.6


def test_a_session_header_keeps_unrelated_prompts_together(client: openai.OpenAI) -> None:
    for session in ("alpha", "beta", "gamma"):
        served = {
            ask(client, [{"role": "user", "content": f"Question {i} of {session}"}],
                **{"x-session-id": session})[0]
            for i in range(5)
        }  # fmt: skip
        assert len(served) == 1


def test_sessions_spread_evenly_over_the_pool(client: openai.OpenAI) -> None:
    homes = Counter(
        ask(client, [{"role": "user", "content": "hi"}], **{"x-session-id": f"s{i}"})[0]
        for i in range(150)
    )
    assert set(homes) == set(NAMES)
    assert all(30 <= n <= 70 for n in homes.values()), homes


def test_a_session_moves_while_its_backend_is_past_its_bound_and_comes_back(
    fleet: tuple[Server, dict[str, Server]],
) -> None:
    gateway, _ = fleet
    session = {"x-session-id": "busy"}
    probe = {"model": SIM_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    long = probe | {"max_tokens": 20000, "stream": True, "ignore_eos": True}
    with httpx.Client(base_url=gateway.base_url, headers=session, timeout=30.0) as http:
        home = http.post("/v1/chat/completions", json=probe).headers["x-draftgate-backend"]
        with http.stream("POST", "/v1/chat/completions", json=long) as held:
            assert held.status_code == 200
            assert held.headers["x-draftgate-backend"] == home
            chunks = held.iter_bytes()  # kept: a dropped iterator closes the stream
            next(chunks)  # in flight: one of one on its backend, at the pool's bound
            moved = http.post("/v1/chat/completions", json=probe)
            assert moved.status_code == 200
            assert moved.headers["x-draftgate-affinity"] == "spilled"
            assert moved.headers["x-draftgate-backend"] != home
        # The held stream is closed: once the gateway has let it go, the session is home again.
        wait_for_metric(gateway.base_url, "draftgate_backend_in_flight", 0, 10.0, backend=home)
        back = http.post("/v1/chat/completions", json=probe)
        assert (back.headers["x-draftgate-backend"], back.headers["x-draftgate-affinity"]) == (
            home,
            "home",
        )
    spilled = metric_value(gateway.base_url, "draftgate_affinity_routes_total", outcome="spilled")
    assert spilled >= 1


def test_without_a_key_or_with_affinity_off_requests_balance_on_load(
    fleet: tuple[Server, dict[str, Server]], start_module_gateway: ModuleGatewayStarter
) -> None:
    _, sims = fleet
    backends = [fleet_backend(n, s.base_url) for n, s in sims.items()]
    off, _ = start_module_gateway(backends, AFFINITY="false")
    served: defaultdict[str, int] = defaultdict(int)
    with httpx.Client(base_url=off.base_url, timeout=30.0) as http:
        for _ in range(30):
            body = {"model": SIM_MODEL, "messages": [SYSTEM], "max_tokens": 2}
            response = http.post("/v1/chat/completions", json=body, headers={"x-session-id": "s"})
            assert "x-draftgate-affinity" not in response.headers
            served[response.headers["x-draftgate-backend"]] += 1
    assert len(served) >= 2  # one session, yet more than one backend
