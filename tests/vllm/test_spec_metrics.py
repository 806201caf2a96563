"""Real vLLM's spec-decode counters as draftgate reads them: acceptance as vLLM defines it,
moving where drafts are accepted, present but idle on random drafters, absent on plain; and
the gateway's collector turning them into measurements without a false method mismatch."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from backends.vllm_metrics import Observation, VllmSnapshot, difference, parse_metrics
from tests.e2e.conftest import ModuleGatewayStarter, Server, fleet_backend, metric_value, query_rows
from tests.vllm.conftest import REQUEST_TIMEOUT_S, K, RealServer, backend_name, fleet_entry

pytestmark = pytest.mark.vllm

PROMPT = "import os\nimport sys\n"
MISMATCH = "draftgate_backend_method_mismatch"
# Short windows of a CPU vLLM hold few requests: the gate is lowered to store them.
COLLECTOR = {"COLLECT_INTERVAL_S": "0.5", "MEASUREMENT_WINDOW_S": "2", "REGISTRY_REFRESH_S": "0.5",
             "MEASUREMENT_MIN_REQUESTS": "1", "MEASUREMENT_MIN_OUTPUT_TOKENS": "1"}  # fmt: skip


@dataclass(frozen=True)
class RawCounters:
    """The spec-decode counters summed straight from the exposition, without draftgate."""

    drafts: float
    accepted: float
    per_position: dict[str, float]


def _page(server: RealServer) -> str:
    return httpx.get(f"{server.url}/metrics", timeout=10).text


def _raw(text: str) -> RawCounters:
    drafts = accepted = 0.0
    per_position: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "vllm:spec_decode_num_drafts_total":
                drafts += s.value
            elif s.name == "vllm:spec_decode_num_accepted_tokens_total":
                accepted += s.value
            elif s.name == "vllm:spec_decode_num_accepted_tokens_per_pos_total":
                per_position[s.labels["position"]] = s.value
    return RawCounters(drafts, accepted, per_position)


def _greedy(server: RealServer, requests: int = 3, max_tokens: int = 48) -> None:
    body = {
        "model": server.model,
        "prompt": PROMPT,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }
    with httpx.Client(base_url=server.url, timeout=REQUEST_TIMEOUT_S) as http:
        for i in range(requests):
            response = http.post("/v1/completions", json={**body, "prompt": PROMPT * (i + 1)})
            assert response.status_code == 200, response.text


def _observe(server: RealServer) -> tuple[Observation, RawCounters, RawCounters, VllmSnapshot]:
    """Greedy traffic between two scrapes: draftgate's reading and the raw counters."""
    before_text = _page(server)
    _greedy(server)
    after_text = _page(server)
    after = parse_metrics(after_text)
    observation = difference(parse_metrics(before_text), after, 1.0)
    assert observation is not None
    return observation, _raw(before_text), _raw(after_text), after


def test_plain_vllm_exposes_no_spec_decode_counters(vllm_servers: dict[str, RealServer]) -> None:
    text = _page(vllm_servers["plain"])
    assert "vllm:generation_tokens_total" in text
    assert "vllm:spec_decode" not in text
    snapshot = parse_metrics(text)
    assert (snapshot.drafts, snapshot.accepted_per_position) == (None, None)
    assert snapshot.generation_tokens > 0  # the warm-up request


@pytest.mark.parametrize(("key", "k"), [("ngram", K["ngram"]), ("self-draft", K["draft_model"])])
def test_acceptance_moves_and_is_read_as_vllm_defines_it(
    key: str, k: int, vllm_servers: dict[str, RealServer]
) -> None:
    observation, before, after, snapshot = _observe(vllm_servers[key])
    drafts = after.drafts - before.drafts
    accepted = after.accepted - before.accepted
    assert observation.drafts == drafts > 0
    assert observation.accepted == accepted > 0
    # vLLM's mean acceptance length counts the bonus token: 1 + accepted / drafts.
    acceptance_length = 1 + observation.accepted / observation.drafts
    assert acceptance_length > 1.5  # random models loop under greedy decoding
    per_position = [
        after.per_position[str(i)] - before.per_position.get(str(i), 0.0) for i in range(k)
    ]
    assert list(observation.accepted_per_position) == per_position
    assert sum(per_position) == accepted
    # Position i is accepted only after positions 0..i-1 were: rates never rise.
    rates = [p / drafts for p in per_position]
    assert rates == sorted(rates, reverse=True)
    assert rates[0] > 0.5
    assert snapshot.accepted_per_position is not None
    assert len(snapshot.accepted_per_position) == k


@pytest.mark.parametrize(("key", "k"), [("p-eagle", K["p-eagle"]), ("dflash", K["dflash"])])
def test_random_drafters_draft_but_are_not_accepted(
    key: str, k: int, vllm_servers: dict[str, RealServer]
) -> None:
    observation, _, after, snapshot = _observe(vllm_servers[key])
    assert sorted(after.per_position) == [str(i) for i in range(k)]  # every position exposed
    assert observation.drafts > 20
    # Random weights: (almost) nothing accepted.
    assert 1 + observation.accepted / observation.drafts < 1.1
    assert snapshot.drafts is not None
    assert snapshot.draft_tokens == pytest.approx(snapshot.drafts * k)


@pytest.fixture(scope="module")
def collecting_gateway(
    vllm_servers: dict[str, RealServer], start_module_gateway: ModuleGatewayStarter
) -> tuple[Server, str]:
    entries = [fleet_entry(s) for s in vllm_servers.values()]
    # Two declarations that contradict what the servers run.
    entries.append(
        fleet_backend(
            "liar-ngram", vllm_servers["plain"].url, "ngram", model="liar-a", k=4, gpu_type="cpu"
        )
    )
    entries.append(
        fleet_backend("liar-plain", vllm_servers["dflash"].url, model="liar-b", gpu_type="cpu")
    )
    return start_module_gateway(entries, **COLLECTOR)


def _scrape_rows(database_url: str, backend: str) -> list[dict[str, object]]:
    return query_rows(
        database_url,
        "SELECT * FROM measurements WHERE source = 'scrape' AND backend_name = :b",
        b=backend,
    )


def test_the_collector_measures_real_servers_and_flags_only_liars(
    collecting_gateway: tuple[Server, str], vllm_servers: dict[str, RealServer]
) -> None:
    gateway, database_url = collecting_gateway
    server = vllm_servers["self-draft"]
    before = _raw(_page(server))
    deadline = time.monotonic() + 60
    body = {
        "model": server.model,
        "prompt": PROMPT,
        "max_tokens": 64,
        "temperature": 0,
        "ignore_eos": True,
    }
    with httpx.Client(base_url=gateway.base_url, timeout=REQUEST_TIMEOUT_S) as http:
        while not _scrape_rows(database_url, backend_name(server)):
            assert time.monotonic() < deadline, "no scrape measurement within 60 s"
            assert http.post("/v1/completions", json=body).status_code == 200
    after = _raw(_page(server))
    [row, *_] = _scrape_rows(database_url, backend_name(server))
    assert (row["method"], row["k"], row["gpu_type"]) == ("draft_model", K["draft_model"], "cpu")
    assert row["output_tokens_per_s"] > 0
    direct = 1 + (after.accepted - before.accepted) / (after.drafts - before.drafts)
    assert row["mean_acceptance_length"] == pytest.approx(direct, rel=0.2)
    per_position = row["acceptance_per_position"]
    if isinstance(per_position, str):  # a JSON column read back from SQLite
        per_position = json.loads(per_position)
    assert len(per_position) == K["draft_model"]  # type: ignore[arg-type]
    honest = [backend_name(s) for s in vllm_servers.values()]
    flags = {
        name: metric_value(gateway.base_url, MISMATCH, backend=name)
        for name in [*honest, "liar-ngram", "liar-plain"]
    }
    assert flags == dict.fromkeys(honest, 0) | {"liar-ngram": 1, "liar-plain": 1}


def test_each_requests_own_acceptance_is_recorded_and_adds_up_to_the_counters(
    collecting_gateway: tuple[Server, str], vllm_servers: dict[str, RealServer]
) -> None:
    """vLLM's per-request spec decode block, read by the gateway from whole answers and
    streams, is on each usage record; the records add up to the server's own counters. The
    block reaches only the client that asked for it."""
    gateway, database_url = collecting_gateway
    server = vllm_servers["ngram"]
    before = _raw(_page(server))
    ids = []
    with httpx.Client(base_url=gateway.base_url, timeout=REQUEST_TIMEOUT_S) as http:
        for i, stream in enumerate((False, True, False)):
            request_id = f"spec-{i}-{time.time_ns()}"
            ids.append(request_id)
            body = {
                "model": server.model,
                "prompt": PROMPT * (i + 1),
                "max_tokens": 32,
                "temperature": 0,
                "ignore_eos": True,
                "stream": stream,
            }
            headers = {"x-request-id": request_id}
            if i == 0:  # the first asks for the block; the third did not, and gets none
                headers["x-draftgate-include-speculation"] = "true"
            answer = http.post("/v1/completions", json=body, headers=headers)
            assert answer.status_code == 200, answer.text
            if i == 0:
                block = answer.json()["metrics"]["speculative_decoding"]
                assert block["num_spec_steps"] > 0
            elif not stream:
                metrics = answer.json().get("metrics") or {}
                assert "speculative_decoding" not in metrics, answer.json()
    after = _raw(_page(server))
    deadline = time.monotonic() + 60
    while True:
        rows = query_rows(
            database_url,
            "SELECT spec_steps, draft_tokens, accepted_tokens FROM usage_records "
            "WHERE client_request_id IN (:a, :b, :c)",
            a=ids[0], b=ids[1], c=ids[2],
        )  # fmt: skip
        if len(rows) == 3 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert len(rows) == 3, rows
    assert all(r["spec_steps"] and r["spec_steps"] > 0 for r in rows), rows
    assert sum(r["spec_steps"] for r in rows) == after.drafts - before.drafts
    assert sum(r["accepted_tokens"] for r in rows) == after.accepted - before.accepted
    assert all(r["draft_tokens"] <= K["ngram"] * r["spec_steps"] for r in rows), rows
