"""The simulator's vLLM API end to end: real `draftgate sim` processes, openai client, raw HTTP."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from backends.sim.config import SimConfig, acceptance_profile, max_model_len
from tests.e2e.conftest import (
    SIM_MODEL,
    ModuleServerStarter,
    Server,
    ServerStarter,
    draftgate_env,
    sim_args,
)

K = 7
SPEC_SERVER = sim_args(
    "--method", "p-eagle", "--k", str(K), "--time-scale", "20", "--per-request-spec-metrics"
)
PLAIN_NAME = "sim-plain"
PLAIN_SERVER = sim_args(
    "--method", "plain", "--served-model-name", PLAIN_NAME, "--max-num-seqs", "2",
    "--time-scale", "4", "--no-enable-prefix-caching",
)  # fmt: skip
SPEC_KEYS = {
    "mean_acceptance_length",
    "draft_acceptance_rate",
    "acceptance_histogram",
    "num_spec_steps",
    "num_accepted_draft_tokens",
    "num_draft_tokens",
    "num_spec_tokens",
}
POLL_INTERVAL_S = 0.02


@pytest.fixture(scope="module")
def servers(start_module_servers: ModuleServerStarter) -> list[Server]:
    """A p-eagle K=7 server with per-request spec metrics, and a small plain one."""
    return start_module_servers(SPEC_SERVER, PLAIN_SERVER)


@pytest.fixture(scope="module")
def spec_server(servers: list[Server]) -> Server:
    """The p-eagle K=7 server (time scale 20, per-request spec metrics)."""
    return servers[0]


@pytest.fixture(scope="module")
def plain_server(servers: list[Server]) -> Server:
    """The plain server: served as `sim-plain`, at most 2 sequences, time scale 4, no
    prefix caching."""
    return servers[1]


@pytest.fixture(scope="module")
def llm(spec_server: Server) -> Iterator[openai.OpenAI]:
    """The official client, pointed at the speculative server."""
    with openai_client(spec_server) as client:
        yield client


@pytest.fixture(scope="module")
def http(spec_server: Server) -> Iterator[httpx.Client]:
    """A raw HTTP client for the speculative server."""
    with spec_server.client() as client:
        yield client


def openai_client(server: Server) -> openai.OpenAI:
    """The official client for `server`, without retries."""
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0, timeout=10.0)


def chat_body(content: str = "Say something.", **extra: Any) -> dict[str, Any]:
    """A raw chat request to the speculative server."""
    return {"model": SIM_MODEL, "messages": [{"role": "user", "content": content}], **extra}


def text_body(**extra: Any) -> dict[str, Any]:
    """A raw text completion request to the speculative server."""
    return {"model": SIM_MODEL, "prompt": "Hello", **extra}


def samples(http: httpx.Client) -> list[Sample]:
    """Every sample of GET /metrics, parsed back by prometheus_client."""
    response = http.get("/metrics")
    assert response.status_code == 200
    families = text_string_to_metric_families(response.text)
    return [sample for family in families for sample in family.samples]


def families(http: httpx.Client) -> dict[str, Any]:
    """GET /metrics by family name (counters without `_total`)."""
    return {
        family.name: family for family in text_string_to_metric_families(http.get("/metrics").text)
    }


def value(all_samples: list[Sample], name: str, **labels: str) -> float:
    """The one sample called `name` carrying `labels` (0 if there is none yet)."""
    found = [s.value for s in all_samples if s.name == name and labels.items() <= s.labels.items()]
    assert len(found) <= 1, f"{name}{labels} matches {len(found)} samples"
    return found[0] if found else 0.0


def assert_serving(http: httpx.Client, model: str = SIM_MODEL) -> None:
    """A normal request still succeeds."""
    body = {"model": model, "messages": [{"role": "user", "content": "ok?"}], "max_tokens": 4}
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] >= 1


# --- API shapes ---


def test_health_and_version(http: httpx.Client) -> None:
    assert http.get("/health").status_code == 200
    version = http.get("/version")
    assert version.status_code == 200
    assert set(version.json()) == {"version"}
    assert isinstance(version.json()["version"], str)
    assert version.json()["version"]


def test_models_lists_the_served_model(llm: openai.OpenAI) -> None:
    models = llm.models.list().data
    assert len(models) == 1
    card = models[0]
    assert (card.id, card.object, card.owned_by) == (SIM_MODEL, "model", "vllm")
    assert card.model_extra is not None
    assert card.model_extra["max_model_len"] == max_model_len(SimConfig(model=SIM_MODEL))


def test_chat_stops_at_max_tokens_with_ignore_eos(llm: openai.OpenAI) -> None:
    response = llm.chat.completions.create(
        model=SIM_MODEL,
        messages=[{"role": "user", "content": "Tell me about batching."}],
        max_tokens=32,
        extra_body={"ignore_eos": True},
    )
    assert response.object == "chat.completion"
    assert response.model == SIM_MODEL
    choice = response.choices[0]
    assert choice.finish_reason == "length"
    assert choice.message.role == "assistant"
    assert choice.message.content
    usage = response.usage
    assert usage is not None
    assert usage.completion_tokens == 32
    assert usage.prompt_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_chat_without_ignore_eos_stops_on_its_own(llm: openai.OpenAI) -> None:
    response = llm.chat.completions.create(
        model=SIM_MODEL, messages=[{"role": "user", "content": "A short answer, please."}]
    )
    assert response.choices[0].finish_reason == "stop"
    assert response.usage is not None
    assert 1 <= response.usage.completion_tokens < 32768 - response.usage.prompt_tokens


def test_chat_stream_with_usage(llm: openai.OpenAI) -> None:
    messages: Any = [{"role": "user", "content": "Stream a story."}]
    whole = llm.chat.completions.create(
        model=SIM_MODEL, messages=messages, max_tokens=40, extra_body={"ignore_eos": True}
    )
    chunks = list(
        llm.chat.completions.create(
            model=SIM_MODEL,
            messages=messages,
            max_tokens=40,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    with_choices = [chunk for chunk in chunks if chunk.choices]
    final = chunks[-1]
    assert final.choices == []
    assert chunks.index(final) == len(with_choices)  # usage comes last, once
    content = [chunk.choices[0].delta.content or "" for chunk in with_choices]
    assert len([part for part in content if part]) >= 2  # really streamed
    text = "".join(content)
    assert text
    assert text == whole.choices[0].message.content  # same prompt, same text
    finishes = [chunk.choices[0].finish_reason for chunk in with_choices]
    assert finishes[-1] == "length"
    assert set(finishes[:-1]) == {None}
    assert final.usage is not None
    assert whole.usage is not None
    assert final.usage.completion_tokens == 40 == whole.usage.completion_tokens
    assert final.usage.prompt_tokens == whole.usage.prompt_tokens


def test_completions_whole_and_streamed(llm: openai.OpenAI) -> None:
    prompt = "Once upon a time"
    whole = llm.completions.create(
        model=SIM_MODEL, prompt=prompt, max_tokens=24, extra_body={"ignore_eos": True}
    )
    assert whole.object == "text_completion"
    assert whole.choices[0].finish_reason == "length"
    assert whole.choices[0].text
    assert whole.usage is not None
    assert whole.usage.completion_tokens == 24
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + 24
    chunks = list(
        llm.completions.create(
            model=SIM_MODEL,
            prompt=prompt,
            max_tokens=24,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    with_choices = [chunk for chunk in chunks if chunk.choices]
    assert "".join(chunk.choices[0].text for chunk in with_choices) == whole.choices[0].text
    assert with_choices[-1].choices[0].finish_reason == "length"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 24


def test_same_prompt_gives_same_text(llm: openai.OpenAI) -> None:
    def text(prompt: str) -> str | None:
        response = llm.chat.completions.create(
            model=SIM_MODEL,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=16,
            extra_body={"ignore_eos": True},
        )
        return response.choices[0].message.content

    first = text("What is speculative decoding?")
    assert first
    assert text("What is speculative decoding?") == first
    assert text("What is continuous batching?") != first


def test_served_model_name(plain_server: Server) -> None:
    with openai_client(plain_server) as client:
        cards = client.models.list().data
        assert [card.id for card in cards] == [PLAIN_NAME]
        assert cards[0].model_extra is not None
        assert cards[0].model_extra["root"] == SIM_MODEL
        response = client.chat.completions.create(
            model=PLAIN_NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=5
        )
        assert response.model == PLAIN_NAME
        assert response.usage is not None
        assert response.usage.completion_tokens <= 5
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(
                model=SIM_MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5
            )


# --- Per-request speculative-decoding metrics ---


def test_per_request_spec_metrics(llm: openai.OpenAI) -> None:
    response = llm.chat.completions.create(
        model=SIM_MODEL,
        messages=[{"role": "user", "content": "Explain drafting."}],
        max_tokens=64,
        extra_body={"ignore_eos": True},
    )
    assert response.model_extra is not None
    spec = response.model_extra["metrics"]["speculative_decoding"]
    assert set(spec) == SPEC_KEYS
    steps, accepted = spec["num_spec_steps"], spec["num_accepted_draft_tokens"]
    assert spec["num_spec_tokens"] == K
    assert 64 / (K + 1) <= steps <= 64
    assert spec["num_draft_tokens"] == K * steps
    assert spec["mean_acceptance_length"] == pytest.approx(1 + accepted / steps)
    assert spec["draft_acceptance_rate"] == pytest.approx(accepted / spec["num_draft_tokens"])
    histogram = spec["acceptance_histogram"]
    assert len(histogram) == K + 1
    assert sum(histogram) == steps
    assert sum(n * count for n, count in enumerate(histogram)) == accepted


def test_per_request_spec_metrics_on_the_usage_chunk(llm: openai.OpenAI) -> None:
    chunks = list(
        llm.chat.completions.create(
            model=SIM_MODEL,
            messages=[{"role": "user", "content": "Explain verification."}],
            max_tokens=30,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    extra = chunks[-1].model_extra
    assert extra is not None
    spec = extra["metrics"]["speculative_decoding"]
    assert set(spec) == SPEC_KEYS
    steps = spec["num_spec_steps"]
    assert spec["mean_acceptance_length"] == pytest.approx(
        1 + spec["num_accepted_draft_tokens"] / steps
    )


# --- /metrics ---


def test_spec_decode_counters_are_exposed(http: httpx.Client) -> None:
    assert_serving(http)
    by_name = families(http)
    labels = {"model_name": SIM_MODEL, "engine": "0"}
    for name in (
        "vllm:spec_decode_num_drafts",
        "vllm:spec_decode_num_draft_tokens",
        "vllm:spec_decode_num_accepted_tokens",
    ):
        family = by_name[name]
        assert family.type == "counter"
        totals = [s for s in family.samples if s.name == f"{name}_total"]
        assert [s.labels for s in totals] == [labels]
        assert totals[0].value > 0
    per_pos = by_name["vllm:spec_decode_num_accepted_tokens_per_pos"]
    assert per_pos.type == "counter"
    totals = [s for s in per_pos.samples if s.name.endswith("_total")]
    assert sorted(s.labels["position"] for s in totals) == [str(i) for i in range(K)]
    assert all(s.labels.items() >= labels.items() for s in totals)


def test_a_shared_prefix_is_served_from_the_prefix_cache(
    http: httpx.Client, plain_server: Server
) -> None:
    """vLLM's prefix-cache counters: the second turn of a chat finds the first turn's
    prompt cached (every full 16-token block but the one holding the last token)."""
    system = {"role": "system", "content": " ".join(f"rule{i}." for i in range(200))}
    first = [system, {"role": "user", "content": "What is rule 7?"}]
    second = [
        *first,
        {"role": "assistant", "content": "Rule 7."},
        {"role": "user", "content": "8?"},
    ]
    before = samples(http)
    usage = []
    for messages in (first, second):
        response = http.post(
            "/v1/chat/completions", json=chat_body(max_tokens=4) | {"messages": messages}
        )
        assert response.status_code == 200, response.text
        usage.append(response.json()["usage"]["prompt_tokens"])
    after = samples(http)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    # The first prompt's tokens: 9 template tokens per message, its content, and 3 more.
    shared = 9 + 400 + 9 + 6  # the system message, then the user's up to where they differ
    assert delta("vllm:prefix_cache_queries_total") == sum(usage)
    assert delta("vllm:prefix_cache_hits_total") == shared // 16 * 16
    local = delta("vllm:prompt_tokens_by_source_total", source="local_compute")
    hit = delta("vllm:prompt_tokens_by_source_total", source="local_cache_hit")
    assert (local + hit, hit) == (sum(usage), shared // 16 * 16)
    assert delta("vllm:prompt_tokens_cached_total") == hit
    assert delta("vllm:prompt_tokens_total") == sum(usage)
    by_name = families(http)
    assert by_name["vllm:prefix_cache_hits"].type == "counter"
    with plain_server.client() as plain:
        assert_serving(plain, PLAIN_NAME)
        assert not any(name.startswith("vllm:prefix_cache") for name in families(plain))


def test_generation_tokens_and_successes_count_requests(
    http: httpx.Client, llm: openai.OpenAI
) -> None:
    before = samples(http)
    completion_tokens = []
    for max_tokens in (5, 17, 40):
        response = llm.chat.completions.create(
            model=SIM_MODEL,
            messages=[{"role": "user", "content": f"Count to {max_tokens}."}],
            max_tokens=max_tokens,
            extra_body={"ignore_eos": True},
        )
        assert response.usage is not None
        completion_tokens.append(response.usage.completion_tokens)
    text = llm.completions.create(
        model=SIM_MODEL, prompt="Go on", max_tokens=11, extra_body={"ignore_eos": True}
    )
    assert text.usage is not None
    completion_tokens.append(text.usage.completion_tokens)
    after = samples(http)
    assert completion_tokens == [5, 17, 40, 11]

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("vllm:generation_tokens_total", model_name=SIM_MODEL) == sum(completion_tokens)
    assert delta("vllm:request_success_total", finished_reason="length") == 4
    assert delta("vllm:time_to_first_token_seconds_count") == 4
    assert delta("vllm:e2e_request_latency_seconds_count") == 4


def test_latency_histograms_and_gauges(http: httpx.Client) -> None:
    assert_serving(http)
    by_name = families(http)
    buckets = {
        "vllm:time_to_first_token_seconds": ("0.001", "2560.0"),
        "vllm:inter_token_latency_seconds": ("0.01", "80.0"),
        "vllm:e2e_request_latency_seconds": ("0.3", "7680.0"),
    }
    for name, (low, high) in buckets.items():
        family = by_name[name]
        assert family.type == "histogram"
        bounds = [s.labels["le"] for s in family.samples if s.name == f"{name}_bucket"]
        assert bounds[0] == low
        assert bounds[-2:] == [high, "+Inf"]
        count = [s.value for s in family.samples if s.name == f"{name}_count"]
        assert count[0] >= 1
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
    ):
        family = by_name[name]
        assert family.type == "gauge"
        assert [s.labels for s in family.samples] == [{"model_name": SIM_MODEL, "engine": "0"}]


def test_plain_server_has_no_spec_decode_metrics(plain_server: Server) -> None:
    with plain_server.client() as client:
        assert_serving(client, PLAIN_NAME)
        all_samples = samples(client)
    assert not [s for s in all_samples if s.name.startswith("vllm:spec_decode")]
    assert value(all_samples, "vllm:generation_tokens_total", model_name=PLAIN_NAME) >= 1


async def test_acceptance_statistics_follow_the_profile(http: httpx.Client) -> None:
    before = samples(http)
    async with httpx.AsyncClient(base_url=str(http.base_url), timeout=30.0) as client:
        bodies = [
            chat_body(f"Question number {i}?", max_tokens=200, ignore_eos=True) for i in range(20)
        ]
        responses = await asyncio.gather(
            *(client.post("/v1/chat/completions", json=body) for body in bodies)
        )
    assert [r.json()["usage"]["completion_tokens"] for r in responses] == [200] * 20
    after = samples(http)

    def delta(name: str, **labels: str) -> float:
        return value(after, f"vllm:spec_decode_{name}_total", **labels) - value(
            before, f"vllm:spec_decode_{name}_total", **labels
        )

    drafts, accepted = delta("num_drafts"), delta("num_accepted_tokens")
    assert delta("num_draft_tokens") == K * drafts
    profile = acceptance_profile(SimConfig(model=SIM_MODEL, method="p-eagle", k=K, workload="chat"))
    assert profile is not None
    expected = profile.mean_acceptance_length(K)
    assert 1 + accepted / drafts == pytest.approx(expected, rel=0.10)
    per_pos = [delta("num_accepted_tokens_per_pos", position=str(i)) for i in range(K)]
    assert sum(per_pos) == accepted
    assert per_pos == sorted(per_pos, reverse=True)
    assert per_pos[0] > 0


async def test_requests_wait_when_the_batch_is_full(plain_server: Server) -> None:
    body = {"model": PLAIN_NAME, "prompt": "Long one", "max_tokens": 600, "ignore_eos": True}
    async with httpx.AsyncClient(base_url=plain_server.base_url, timeout=30.0) as client:
        requests = [
            asyncio.create_task(client.post("/v1/completions", json=body)) for _ in range(6)
        ]
        gauges: list[tuple[float, float]] = []
        while not all(task.done() for task in requests):
            text = (await client.get("/metrics")).text
            current = [s for f in text_string_to_metric_families(text) for s in f.samples]
            gauges.append(
                (
                    value(current, "vllm:num_requests_running"),
                    value(current, "vllm:num_requests_waiting"),
                )
            )
            await asyncio.sleep(POLL_INTERVAL_S)
        responses = await asyncio.gather(*requests)
    assert [r.status_code for r in responses] == [200] * 6
    assert [r.json()["usage"]["completion_tokens"] for r in responses] == [600] * 6
    assert max(waiting for _, waiting in gauges) >= 1
    assert max(running for running, _ in gauges) <= 2


# --- Bad input ---

TOO_LONG = "maximum context length"
CHAT, TEXT = "/v1/chat/completions", "/v1/completions"
LONG_TEXT = "x " * 1_000_000  # two million characters
BAD_REQUESTS = {
    "malformed-json": (CHAT, b'{"model": "x", ', 400, "JSON"),
    "json-array": (CHAT, [chat_body()], 400, "object"),
    "max-tokens-0": (CHAT, chat_body(max_tokens=0), 400, "max_tokens"),
    "max-tokens-negative": (TEXT, text_body(max_tokens=-5), 400, "max_tokens"),
    "unknown-model": (CHAT, {**chat_body(), "model": "no/such"}, 404, "no/such"),
    "messages-missing": (CHAT, {"model": SIM_MODEL}, 400, "messages"),
    "messages-empty": (CHAT, {"model": SIM_MODEL, "messages": []}, 400, "messages"),
    "prompt-too-long": (TEXT, text_body(prompt=LONG_TEXT), 400, TOO_LONG),
    "chat-too-long": (CHAT, chat_body(LONG_TEXT), 400, TOO_LONG),
    "max-tokens-over-context": (CHAT, chat_body(max_tokens=10**6), 400, TOO_LONG),
    "n-2": (CHAT, chat_body(n=2), 400, "n must"),
    "stream-options-without-stream": (
        CHAT,
        chat_body(stream_options={"include_usage": True}),
        400,
        "stream",
    ),
    "unknown-route": ("/v1/embeddings", chat_body(), 404, "Not Found"),
}


@pytest.mark.parametrize("case", BAD_REQUESTS.values(), ids=BAD_REQUESTS.keys())
def test_bad_request_gets_a_vllm_error(
    http: httpx.Client, case: tuple[str, object, int, str]
) -> None:
    path, body, status, fragment = case
    if isinstance(body, bytes):
        response = http.post(path, content=body, headers={"content-type": "application/json"})
    else:
        response = http.post(path, json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == {400: "BadRequestError", 404: "NotFoundError"}[status]
    assert error["code"] == status
    assert fragment in error["message"]
    assert_serving(http)


def test_unknown_get_route_is_404(http: httpx.Client) -> None:
    response = http.get("/v2/whatever")
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "NotFoundError"
    assert_serving(http)


def test_openai_client_sees_bad_requests(llm: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        llm.chat.completions.create(
            model=SIM_MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=0
        )
    with pytest.raises(openai.NotFoundError):
        llm.completions.create(model="no/such-model", prompt="hi", max_tokens=3)


# --- Time scale ---


def _timed_request(server: Server) -> tuple[float, dict[str, Any]]:
    """The best wall time of two 100-token requests (after a warm-up), and the usage."""
    body = {"model": SIM_MODEL, "prompt": "Time me", "max_tokens": 100, "ignore_eos": True}
    with server.client() as client:
        client.post("/v1/completions", json={**body, "max_tokens": 2})  # warm up
        best, usage = float("inf"), {}
        for _ in range(2):
            started = time.perf_counter()
            response = client.post("/v1/completions", json=body)
            best = min(best, time.perf_counter() - started)
            assert response.status_code == 200
            usage = response.json()["usage"]
    return best, usage


def test_time_scale_speeds_up_generation(start_server: ServerStarter) -> None:
    config = ("--method", "p-eagle", "--k", str(K))
    real_time, scaled = (
        start_server(*sim_args(*config, "--time-scale", scale), env=draftgate_env(), wait=False)
        for scale in ("1", "10")
    )
    real_time.wait_healthy()
    scaled.wait_healthy()
    real_s, real_usage = _timed_request(real_time)
    scaled_s, scaled_usage = _timed_request(scaled)
    assert real_usage["completion_tokens"] == scaled_usage["completion_tokens"] == 100
    assert scaled_s < 0.5 * real_s, (scaled_s, real_s)
