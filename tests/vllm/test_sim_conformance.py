"""The simulator against real vLLM, method by method: every `vllm:*` family it exposes is one
real vLLM exposes for that method (same type, help and label names), spec-decode families
exactly when the method speculates, and its responses have real vLLM's keys, chunk by chunk.
"""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from backends import vllm_metrics as vm
from tests.e2e.conftest import ModuleServerStarter, Server, sim_args, start_module_servers
from tests.vllm.conftest import K, RealServer

__all__ = ["start_module_servers"]  # the e2e fixture starting `draftgate sim` processes
pytestmark = pytest.mark.vllm

# Tier key -> the simulator's method and K for the same server.
SIM_METHODS = {
    "plain": ("plain", None),
    "ngram": ("ngram", K["ngram"]),
    "self-draft": ("draft_model", K["draft_model"]),
    "p-eagle": ("p-eagle", K["p-eagle"]),
    "dflash": ("dflash", K["dflash"]),
}
SPEC_FAMILIES = {
    m.name
    for m in (
        vm.SPEC_DRAFTS,
        vm.SPEC_DRAFT_TOKENS,
        vm.SPEC_ACCEPTED_TOKENS,
        vm.SPEC_ACCEPTED_PER_POS,
    )
}
# What draftgate reads from vLLM: the simulator must expose at least these.
READ_BY_DRAFTGATE = {
    m.name
    for m in (
        vm.PROMPT_TOKENS,
        vm.GENERATION_TOKENS,
        vm.REQUESTS_RUNNING,
        vm.REQUESTS_WAITING,
        vm.KV_CACHE_USAGE,
        vm.E2E_LATENCY,
    )
}
# vLLM caches prefixes by default, and so does the simulator.
PREFIX_FAMILIES = {
    m.name
    for m in (
        vm.PREFIX_CACHE_QUERIES,
        vm.PREFIX_CACHE_HITS,
        vm.PROMPT_TOKENS_BY_SOURCE,
        vm.PROMPT_TOKENS_CACHED,
    )
}
Family = tuple[str, str, frozenset[str]]  # type, help, label names


@pytest.fixture(scope="module")
def sims(start_module_servers: ModuleServerStarter) -> dict[str, Server]:
    """A simulator per tier server, serving the same name with the same method and K."""
    args = []
    for key, (method, k) in SIM_METHODS.items():
        options = ["--method", method, "--served-model-name", f"tiny-{key}",
                   "--max-model-len", "512", "--time-scale", "50"]  # fmt: skip
        args.append(sim_args(*options, *(["--k", str(k)] if k else [])))
    return dict(zip(SIM_METHODS, start_module_servers(*args), strict=True))


def _families(base_url: str) -> dict[str, Family]:
    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    families = {}
    for family in text_string_to_metric_families(text):
        if family.name.startswith("vllm:"):
            labels = frozenset(k for s in family.samples for k in s.labels if k != "le")
            families[family.name] = (family.type, family.documentation, labels)
    return families


@pytest.mark.parametrize("key", list(SIM_METHODS))
def test_the_simulators_metrics_are_real_vllms(
    key: str, sims: dict[str, Server], vllm_servers: dict[str, RealServer]
) -> None:
    simulated, real = _families(sims[key].base_url), _families(vllm_servers[key].url)
    speculates = key != "plain"
    assert (simulated.keys() >= SPEC_FAMILIES) is speculates
    assert (real.keys() >= SPEC_FAMILIES) is speculates
    assert simulated.keys() >= READ_BY_DRAFTGATE | PREFIX_FAMILIES
    assert {name: real.get(name) for name in simulated} == simulated


def _json(response: httpx.Response) -> Any:
    assert response.status_code == 200, response.text
    return response.json()


def _keys(value: Any) -> Any:
    """The shape of a JSON value: its keys, recursively (a list by its first element)."""
    if isinstance(value, dict):
        return {k: _keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_keys(value[0])] if value else []
    return None


def _chunks(http: httpx.Client, path: str, body: dict[str, Any]) -> list[Any]:
    with http.stream("POST", path, json=body) as response:
        assert response.status_code == 200
        lines = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [orjson.loads(line) for line in lines[:-1]]


def _shapes(base_url: str, model: str) -> dict[str, Any]:
    """The key shapes of one server's answers to the same requests."""
    chat = {
        "model": model,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        "ignore_eos": True,
    }
    text = {"model": model, "prompt": "hi", "max_tokens": 4, "ignore_eos": True}
    usage = {"stream": True, "stream_options": {"include_usage": True}}
    with httpx.Client(base_url=base_url, timeout=60) as http:
        chat_chunks = _chunks(http, "/v1/chat/completions", chat | usage)
        text_chunks = _chunks(http, "/v1/completions", text | usage)
        shapes = {
            "chat": _json(http.post("/v1/chat/completions", json=chat)),
            "completion": _json(http.post("/v1/completions", json=text)),
            "chat role chunk": chat_chunks[0],
            "chat text chunk": chat_chunks[1],
            "chat last text chunk": chat_chunks[-2],
            "chat usage chunk": chat_chunks[-1],
            "completion text chunk": text_chunks[0],
            "completion last text chunk": text_chunks[-2],
            "completion usage chunk": text_chunks[-1],
        }
        unknown = http.post("/v1/chat/completions", json=chat | {"model": "nope"})
        negative = http.post("/v1/completions", json=text | {"max_tokens": -1})
    shapes = {name: _keys(value) for name, value in shapes.items()}
    for name, error in (("unknown model", unknown), ("bad max_tokens", negative)):
        shapes[name] = (
            error.status_code,
            _keys(error.json()),
            error.json()["error"]["type"],
            error.json()["error"]["param"],
        )
    return shapes


def test_the_simulators_responses_have_real_vllms_keys(
    sims: dict[str, Server], vllm_servers: dict[str, RealServer]
) -> None:
    simulated = _shapes(sims["plain"].base_url, "tiny-plain")
    real = _shapes(vllm_servers["plain"].url, "tiny-plain")
    assert simulated == real
