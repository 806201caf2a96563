"""Cache affinity against real vLLM: two `vllm serve` processes of one method (plain), each
also serving `tiny-pool`, behind the gateway. Multi-turn sessions (text completions, each
turn's prompt the last one plus its reply and a new line) find more of their prompts in
vLLM's own prefix cache (`vllm:prefix_cache_hits` over `vllm:prefix_cache_queries`) when
the gateway routes them by affinity than when each turn goes to a random server."""

from __future__ import annotations

import random
from collections.abc import Callable

import httpx
import pytest

from backends.vllm_metrics import PREFIX_CACHE_HITS, PREFIX_CACHE_QUERIES, parse_metrics
from tests.e2e.conftest import ModuleGatewayStarter, Server, fleet_backend
from tests.vllm.conftest import CPU, POOL_KEYS, POOL_MODEL, REQUEST_TIMEOUT_S, RealServer

pytestmark = pytest.mark.vllm

SESSIONS = 6
TURNS = 3
WORDS = "def return value list index count total item name data while for print".split()


@pytest.fixture(scope="module")
def pool(vllm_servers: dict[str, RealServer]) -> list[RealServer]:
    return [vllm_servers[key] for key in POOL_KEYS]


@pytest.fixture(scope="module")
def gateway(pool: list[RealServer], start_module_gateway: ModuleGatewayStarter) -> Server:
    backends = [fleet_backend(f"pool-{s.key}", s.url, model=POOL_MODEL, gpu_type=CPU) for s in pool]
    server, _ = start_module_gateway(backends)
    return server


def opening(seed: str, words: int) -> str:
    rng = random.Random(seed)
    return " ".join(f"{rng.choice(WORDS)}{rng.randrange(100)}" for _ in range(words))


def cache_counters(pool: list[RealServer]) -> tuple[float, float]:
    """Σ (queries, hits) of vLLM's prefix cache over the pool, in tokens."""
    queries = hits = 0.0
    for server in pool:
        page = httpx.get(f"{server.url}/metrics", timeout=10).text
        snapshot = parse_metrics(page)
        assert snapshot.prefix_cache_queries is not None, PREFIX_CACHE_QUERIES.name
        assert snapshot.prefix_cache_hits is not None, PREFIX_CACHE_HITS.name
        queries += snapshot.prefix_cache_queries
        hits += snapshot.prefix_cache_hits
    return queries, hits


def run_sessions(post: Callable[[int, str], httpx.Response], tag: str) -> list[set[str]]:
    """SESSIONS conversations of TURNS turns; which servers served each conversation."""
    served = []
    for n in range(SESSIONS):
        prompt, backends = opening(f"{tag}-{n}", 120), set()
        for turn in range(TURNS):
            response = post(n, prompt)
            assert response.status_code == 200, response.text
            body = response.json()
            assert body["usage"]["prompt_tokens"] + 16 <= 512, "the prompt outgrew the model"
            backends.add(response.headers.get("x-draftgate-backend", "direct"))
            prompt += body["choices"][0]["text"] + f"\nturn {turn} " + opening(f"{tag}{turn}", 12)
        served.append(backends)
    return served


def body(model: str, prompt: str) -> dict[str, object]:
    return {"model": model, "prompt": prompt, "max_tokens": 16, "temperature": 0}


def test_affinity_finds_more_of_each_prompt_cached_than_random_routing(
    pool: list[RealServer], gateway: Server
) -> None:
    rng = random.Random(7)
    with httpx.Client(timeout=REQUEST_TIMEOUT_S) as http:

        def direct(_: int, prompt: str) -> httpx.Response:
            server = rng.choice(pool)
            return http.post(f"{server.url}/v1/completions", json=body(POOL_MODEL, prompt))

        def through_gateway(_: int, prompt: str) -> httpx.Response:
            url = f"{gateway.base_url}/v1/completions"
            return http.post(url, json=body(POOL_MODEL, prompt))

        rates = {}
        for name, post in (("random", direct), ("affinity", through_gateway)):
            before = cache_counters(pool)
            served = run_sessions(post, name)
            after = cache_counters(pool)
            rates[name] = (after[1] - before[1]) / (after[0] - before[0])
            if name == "affinity":
                assert all(len(s) == 1 for s in served)  # each conversation on one server
    print(
        f"\nvLLM prefix-cache hit rate, {SESSIONS} sessions x {TURNS} turns over 2 servers: "
        f"random routing {rates['random']:.1%}, affinity {rates['affinity']:.1%}"
    )
    assert rates["affinity"] > rates["random"], rates
