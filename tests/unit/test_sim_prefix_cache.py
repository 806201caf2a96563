"""The simulator's prefix cache: chained block hashes, hits skip prefill, LRU in the budget;
the cached tokens its usage says, as vLLM says them."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from backends.sim.config import SimConfig, build_engine
from backends.sim.engine import EngineCore, SimRequest
from backends.sim.prefix_cache import PrefixCache, block_hashes
from backends.sim.protocol import Generation, prompt_details
from backends.sim.text import template_words
from backends.sim.writers import ResponseWriter

PLAIN = SimConfig(model="meta-llama/Llama-3.1-8B-Instruct", method="plain", block_size=16)


def words(n: int, seed: str = "w") -> list[str]:
    return [f"{seed}{i}" for i in range(n)]


def request(name: str, prompt: list[str], block_size: int = 16) -> SimRequest:
    return SimRequest(
        name,
        prompt_tokens=len(prompt),
        max_tokens=4,
        stop_at=4,
        acceptance=None,
        arrived_s=0.0,
        block_hashes=block_hashes(prompt, block_size),
    )


def serve(core: EngineCore, r: SimRequest, now: float = 0.0) -> tuple[float, int, int]:
    """Run `r` alone to its end: (time to its first token, cache queries, cache hits)."""
    core.add(r)
    queries = hits = 0
    t = now
    while not core.idle:
        result = core.step(t)
        t += result.duration_s
        queries, hits = queries + result.cache_queries, hits + result.cache_hits
    assert r.first_token_s is not None
    return r.first_token_s - now, queries, hits


def test_blocks_are_shared_only_up_to_the_first_difference() -> None:
    a = words(64)
    b = [*a[:40], "other", *a[41:]]
    ha, hb = block_hashes(a, 16), block_hashes(b, 16)
    assert len(ha) == len(hb) == 4
    assert ha[:2] == hb[:2]  # tokens 0..31 agree
    assert all(x != y for x, y in zip(ha[2:], hb[2:], strict=True))  # 40 differs: 2 and on
    assert len(block_hashes(words(47), 16)) == 2  # only full blocks


def test_a_repeated_prompt_skips_its_cached_blocks_and_reaches_its_first_token_sooner() -> None:
    core = build_engine(PLAIN)
    prompt = words(4000)
    cold, queries, hits = serve(core, request("a", prompt))
    assert (queries, hits) == (4000, 0)
    warm, queries, hits = serve(core, request("b", prompt), now=10.0)
    # All of it but the last token's block: vLLM computes at least one prompt token.
    assert (queries, hits) == (4000, 3984)
    assert warm < cold / 2


def test_a_longer_turn_hits_the_previous_turns_prompt() -> None:
    core = build_engine(PLAIN)
    first = template_words([("system", " ".join(words(300))), ("user", "hello there")])
    serve(core, request("t1", first))
    second = template_words(
        [
            ("system", " ".join(words(300))),
            ("user", "hello there"),
            ("assistant", "fine"),
            ("user", "and then?"),
        ]
    )
    _, _, hits = serve(core, request("t2", second))
    shared = next(i for i, (x, y) in enumerate(zip(first, second, strict=False)) if x != y)
    assert hits == shared // 16 * 16 > 300


def test_without_prefix_caching_nothing_is_looked_up() -> None:
    core = build_engine(replace(PLAIN, enable_prefix_caching=False))
    prompt = words(500)
    serve(core, request("a", prompt))
    _, queries, hits = serve(core, request("b", prompt))
    assert core.prefix_cache is None
    assert (queries, hits) == (0, 0)


def test_the_least_recently_used_blocks_go_first_when_the_budget_is_full() -> None:
    cache = PrefixCache(block_size=4, capacity_blocks=6)
    a, b, c = (block_hashes(words(12, s), 4) for s in "abc")  # 3 blocks each
    cache.insert(a, blocks_in_use=0)
    cache.insert(b, blocks_in_use=0)
    assert cache.cached_tokens(a, 13) == 12  # a is now the most recently used
    cache.insert(c, blocks_in_use=0)
    assert cache.cached_tokens(b, 13) == 0  # b went
    assert cache.cached_tokens(a, 13) == 12
    assert cache.cached_tokens(c, 13) == 12
    cache.insert((), blocks_in_use=3)  # running requests take half the budget
    assert len(cache) == 3


def test_a_busy_server_keeps_less_of_its_past() -> None:
    """Blocks running requests hold beyond their cached prompts shrink the cache's room."""
    core = build_engine(replace(PLAIN, gpu="H100", gpu_memory_utilization=0.25))
    cache = core.prefix_cache
    assert cache is not None
    half = cache.capacity_blocks // 2
    serve(core, request("old", words(16 * half)))
    long_running = request("long", words(16 * half, "x"))
    long_running.max_tokens = long_running.stop_at = 1000
    core.add(long_running)
    now = 0.0
    while long_running.generated < 320:  # 20 blocks of output, its own
        now += core.step(now).duration_s
    serve(core, request("new", words(64, "y")), now)
    assert len(cache) <= cache.capacity_blocks - 20
    assert cache.cached_tokens(block_hashes(words(16 * half, "x"), 16), 16 * half + 1) == 16 * half


def test_a_request_keeps_what_its_first_admission_found_cached() -> None:
    """vLLM's usage says the tokens found cached when the request was first scheduled."""
    core = build_engine(PLAIN)
    prompt = words(4000)
    cold, warm = request("a", prompt), request("b", prompt)
    serve(core, cold)
    serve(core, warm, now=10.0)
    assert (cold.first_cached_tokens, warm.first_cached_tokens) == (0, 3984)


@pytest.mark.parametrize(
    ("chat", "cached", "said"),
    [
        (True, None, None),  # without --enable-prompt-tokens-details: never
        (True, 0, None),  # a chat says them only when some were found
        (True, 3984, {"cached_tokens": 3984}),
        (False, None, None),
        (False, 0, {"cached_tokens": 0}),  # a text completion always
        (False, 48, {"cached_tokens": 48}),
    ],
)
def test_prompt_details_are_said_as_vllm_says_them(
    chat: bool, cached: int | None, said: dict[str, int] | None
) -> None:
    assert prompt_details(chat, cached) == said
    generation = Generation(
        chat=chat, model="m", prompt_text="p", prompt_tokens=4000, max_tokens=4, stream=True,
        include_usage=True, continuous_usage=True, ignore_eos=True, workload=None,
    )  # fmt: skip
    writer = ResponseWriter(generation)
    closing = writer.closing(4, None, cached).decode()
    usage_chunk, done = closing.split("\n\n")[:2]
    assert done == "data: [DONE]"
    usage = json.loads(usage_chunk.removeprefix("data: "))["usage"]
    assert usage.get("prompt_tokens_details") == said  # on the usage-only chunk alone
    assert "prompt_tokens_details" not in writer.text_chunk("x", None, 1).decode()
    whole = json.loads(writer.full_response("x", "length", 4, None, cached))
    assert whole["usage"]["prompt_tokens_details"] == said  # null when not said
