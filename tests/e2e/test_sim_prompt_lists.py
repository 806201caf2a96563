"""The simulator serves a `/v1/completions` list of prompts as vLLM does: a completion per
prompt, run side by side, choices in list order, usage summed over them (each streamed
chunk's continuous usage that choice's own). A real `draftgate sim` on a socket."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

from tests.e2e.conftest import SIM_MODEL, ModuleServerStarter, Server, metric_value, sim_args

PROMPTS = ["Once upon a time", "The gateway", "Speculative decoding drafts tokens, then"]
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def sim(start_module_servers: ModuleServerStarter) -> Server:
    [server] = start_module_servers(sim_args("--time-scale", "20"))
    return server


def complete(sim: Server, prompt: object, **extra: Any) -> httpx.Response:
    body = {"model": SIM_MODEL, "prompt": prompt, "max_tokens": MAX_TOKENS, "ignore_eos": True}
    return httpx.post(f"{sim.base_url}/v1/completions", json=body | extra, timeout=30)


def test_a_list_is_a_completion_per_prompt(sim: Server) -> None:
    alone = [complete(sim, prompt).json() for prompt in PROMPTS]
    requests = metric_value(sim.base_url, "vllm:request_success_total")
    tokens = metric_value(sim.base_url, "vllm:generation_tokens_total")
    response = complete(sim, PROMPTS)
    assert response.status_code == 200, response.text
    body = response.json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert [c["text"] for c in body["choices"]] == [a["choices"][0]["text"] for a in alone]
    assert body["usage"]["prompt_tokens"] == sum(a["usage"]["prompt_tokens"] for a in alone)
    assert body["usage"]["completion_tokens"] == len(PROMPTS) * MAX_TOKENS
    assert metric_value(sim.base_url, "vllm:request_success_total") == requests + len(PROMPTS)
    generated = metric_value(sim.base_url, "vllm:generation_tokens_total") - tokens
    assert generated == len(PROMPTS) * MAX_TOKENS


def test_a_streamed_list_interleaves_its_choices_and_sums_its_usage(sim: Server) -> None:
    options = {"include_usage": True, "continuous_usage_stats": True}
    response = complete(sim, PROMPTS, stream=True, stream_options=options)
    assert response.status_code == 200, response.text
    lines = [line for line in response.text.split("\n\n") if line]
    assert lines[-1] == "data: [DONE]"
    chunks = [orjson.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    *content, closing = chunks
    texts: dict[int, str] = {}
    for chunk in content:
        [choice] = chunk["choices"]
        texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
        assert chunk["usage"]["completion_tokens"] <= MAX_TOKENS  # the choice's own count
    whole = complete(sim, PROMPTS).json()
    assert texts == {c["index"]: c["text"] for c in whole["choices"]}
    finished = [
        c["choices"][0]["finish_reason"] for c in content if c["choices"][0]["finish_reason"]
    ]
    assert finished == ["length"] * len(PROMPTS)
    # Side by side in the engine: the first tokens of every prompt come before the second.
    assert {c["choices"][0]["index"] for c in content[: len(PROMPTS)]} == {0, 1, 2}
    assert closing["choices"] == []
    totals = {k: closing["usage"][k] for k in ("prompt_tokens", "completion_tokens")}
    assert totals == {k: whole["usage"][k] for k in totals}


def test_lists_of_token_ids_and_bad_lists(sim: Server) -> None:
    ids = complete(sim, [[1, 2, 3], [4, 5]]).json()
    assert (len(ids["choices"]), ids["usage"]["prompt_tokens"]) == (2, 5)
    assert complete(sim, [7, 8, 9]).json()["usage"]["prompt_tokens"] == 3  # one prompt of ids
    for bad in ([], ["text", [1, 2]], [[]], [True]):
        refused = complete(sim, bad)
        assert refused.status_code == 400, (bad, refused.text)
        assert refused.json()["error"]["param"] == "prompt"
