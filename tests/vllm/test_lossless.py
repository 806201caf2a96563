"""The lossless watchdog against real vLLM: every tier server runs the same tiny target (and
serves it as `tiny-target`), one plain and the others each with a speculative method. A real
gateway, sampling every greedy request, serves the model pinned to one method at a time and
replays each answer on plain. Greedy speculative decoding must give the target's own answer,
so each method is held to plain against plain (the floor): 0 divergences where the floor has
none. The servers' own spec-decode counters show that drafts were made and, where the drafter
can guess (n-gram, the target drafting for itself), accepted: the answers compared really
came out of the speculative path."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from backends.vllm_metrics import parse_metrics
from tests.e2e.conftest import ADMIN_TOKEN, ModuleGatewayStarter, Server, metric_value
from tests.vllm.conftest import REQUEST_TIMEOUT_S, TARGET_MODEL, RealServer, fleet_entry

pytestmark = pytest.mark.vllm

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
DROPPED = "draftgate_lossless_dropped_total"
REQUESTS = 24  # greedy requests per method
ANSWER_TOKENS = 64
WAIT_S = 240.0  # a deadline for the replays and their checks, not a wait
WATCHDOG = {"LOSSLESS_SAMPLE_SHARE": "1", "LOSSLESS_MAX_PER_MINUTE": "10000",
            "LOSSLESS_QUEUE": "1000"}  # fmt: skip
# Tier servers that speculate, and whether their drafter can guess the target's tokens
# (the random eagle3 and dflash drafters cannot: every draft is verified and rejected).
SPECULATIVE = {"ngram": True, "self-draft": True, "p-eagle": False, "dflash": False}
LINES = ("total = total + value", "for item in items:", "return self.name", "import os")


@dataclass(frozen=True)
class Drafting:
    """A server's spec-decode counters over some traffic."""

    drafts: float
    accepted: float

    @property
    def acceptance_length(self) -> float:
        """vLLM's mean acceptance length: 1 + accepted tokens per draft."""
        return 1 + self.accepted / self.drafts if self.drafts else 1.0


def _counters(server: RealServer) -> Drafting:
    page = parse_metrics(httpx.get(f"{server.url}/metrics", timeout=10).text)
    return Drafting(page.drafts or 0.0, page.accepted_tokens or 0.0)


@dataclass
class Watchdog:
    """The gateway in front of the tier, and what its watchdog reports."""

    gateway: Server
    client: openai.OpenAI

    def report(self) -> dict[str, Any]:
        response = httpx.get(
            f"{self.gateway.base_url}/admin/v1/lossless",
            params={"model": TARGET_MODEL},
            headers=ADMIN,
            timeout=10.0,
        )
        assert response.status_code == 200, response.text
        models = response.json()["models"]
        return dict(models[0]) if models else {"groups": [], "floor": None}

    def pin(self, method: str) -> None:
        """Serve the model with `method` alone, from now on."""
        url = f"{self.gateway.base_url}/admin/v1/models/{TARGET_MODEL}/policy"
        policy = {"mode": "pinned", "method": method, "explore_fraction": 0}
        response = httpx.put(
            url, json=policy, params={"immediate": "true"}, headers=ADMIN, timeout=10.0
        )
        assert response.status_code == 200, response.text
        until(lambda: self._serves() == method, lambda: f"{method} serves")

    def _serves(self) -> str:
        # No temperature: not greedy, so never sampled
        raw = self.client.completions.with_raw_response.create(
            model=TARGET_MODEL, prompt="which?", max_tokens=1
        )
        return raw.headers["x-draftgate-method"]

    def checked(self, method: str, samples: int) -> list[dict[str, Any]]:
        """The report's groups of `method` once they hold `samples` checks."""
        found: list[dict[str, Any]] = []

        def enough() -> bool:
            found[:] = [g for g in self.report()["groups"] if g["method"] == method]
            return sum(int(g["samples"]) for g in found) >= samples

        until(enough, lambda: f"{samples} checks of {method}: {found}; {self.dropped()}")
        return found

    def dropped(self) -> str:
        """The samples the watchdog dropped, by reason."""
        reasons = ("cap", "queue", "no_reference", "replay_failed")
        counts = {r: metric_value(self.gateway.base_url, DROPPED, reason=r) for r in reasons}
        return f"dropped {counts}"


def until(check: Callable[[], bool], what: Callable[[], str]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {WAIT_S} s: {what()}")
        time.sleep(0.25)


def prompt(tag: str, i: int) -> str:
    """Code with repeated lines, distinct per request: text the n-gram drafter can match."""
    line = f"{LINES[i % len(LINES)]}  # {tag} {i}\n"
    return line * (2 + i % 3)


def ask(client: openai.OpenAI, tag: str, requests: int) -> None:
    """Greedy requests of fixed length: text and chat completions, whole and streamed."""
    for i in range(requests):
        send(client, prompt(tag, i), chat=i % 2 == 1, stream=i % 4 >= 2)


def send(client: openai.OpenAI, text: str, *, chat: bool, stream: bool) -> None:
    """One request, its answer read to the end of the response.

    Not through the SDK's stream iterator: it closes the connection the moment it sees
    `[DONE]`, and a gateway still waiting for its backend's end of stream then records a
    client disconnect (499) and drops the sample, so the count of checks would fall short.
    """
    body: dict[str, Any] = {
        "model": TARGET_MODEL,
        "max_tokens": ANSWER_TOKENS,
        "temperature": 0,
        "stream": stream,
        "extra_body": {"ignore_eos": True},
    }
    create: Any = client.completions.with_streaming_response.create
    if chat:
        create = client.chat.completions.with_streaming_response.create
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    with create(**body) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line]
    # The gateway asked the engine for the token ids it compares; the client did not
    assert not any('_ids":[' in line for line in lines), lines[:2]
    if stream:
        # one event at least: vLLM sends the tokens its client has not read yet as one event,
        # and the tiny CPU model can finish 64 before the first is read (seen in CI)
        assert len(lines) >= 2
        assert lines[-1] == "data: [DONE]", lines[-3:]
    else:
        answer = json.loads("".join(lines))
        assert answer["usage"]["completion_tokens"] == ANSWER_TOKENS
        assert answer["choices"][0]["token_ids"] is None


def describe(name: str, samples: int, divergences: int, interval: list[float]) -> str:
    low, high = interval
    rate = divergences / samples
    figures = f"rate {rate:.3f}, 95% interval [{low:.3f}, {high:.3f}]"
    return f"{name}: {divergences} of {samples} diverged, {figures}"


@pytest.fixture(scope="module")
def watchdog(
    vllm_servers: dict[str, RealServer], start_module_gateway: ModuleGatewayStarter
) -> Iterator[Watchdog]:
    backends = [fleet_entry(s) | {"model": TARGET_MODEL} for s in vllm_servers.values()]
    models = [{"name": TARGET_MODEL, "policy": {"mode": "pinned", "method": "plain"}}]
    gateway, _ = start_module_gateway(backends, models, **WATCHDOG)
    base_url = f"{gateway.base_url}/v1"
    with openai.OpenAI(
        base_url=base_url, api_key="unused", max_retries=0, timeout=REQUEST_TIMEOUT_S
    ) as client:
        yield Watchdog(gateway, client)


@pytest.fixture(scope="module")
def floor(watchdog: Watchdog) -> dict[str, Any]:
    """Plain served and replayed on plain: the report's floor once it holds REQUESTS checks."""
    started = time.monotonic()
    watchdog.pin("plain")
    ask(watchdog.client, "plain", REQUESTS)
    groups = watchdog.checked("plain", REQUESTS)
    floor = dict(watchdog.report()["floor"])
    print(f"\n{describe('plain against plain (floor)', **_counts(floor))}")
    for group in groups:
        print(f"  served by {group['backend']} ({group['engine_version']}): {group}")
    print(f"  {time.monotonic() - started:.0f} s")
    assert all(g["is_floor"] for g in groups)
    assert floor["samples"] == REQUESTS
    assert sum(g["by_tokens"] for g in groups) == REQUESTS  # vLLM returned the ids
    return floor


def _counts(figures: dict[str, Any]) -> dict[str, Any]:
    return {k: figures[k] for k in ("samples", "divergences")} | {
        "interval": figures["interval_95"]
    }


@pytest.mark.parametrize("key", list(SPECULATIVE))
def test_greedy_speculative_answers_are_the_targets_own(
    key: str,
    watchdog: Watchdog,
    floor: dict[str, Any],
    vllm_servers: dict[str, RealServer],
) -> None:
    server = vllm_servers[key]
    method, started = server.spec.method, time.monotonic()
    watchdog.pin(method)
    before = _counters(server)
    ask(watchdog.client, key, REQUESTS)
    after = _counters(server)
    [group] = watchdog.checked(method, REQUESTS)
    drafting = Drafting(after.drafts - before.drafts, after.accepted - before.accepted)
    name = f"{key} ({method}, K={group['k']}) against plain"
    print(f"\n{describe(name, **_counts(group))}")
    print(f"  first divergence: {group['first_divergence']}")
    print(f"  {describe('floor', **_counts(floor))}")
    print(
        f"  {drafting.drafts:.0f} drafts, {drafting.accepted:.0f} tokens accepted, "
        f"acceptance length {drafting.acceptance_length:.2f}; "
        f"{time.monotonic() - started:.0f} s"
    )
    assert group["samples"] == REQUESTS
    assert group["by_tokens"] == REQUESTS  # compared by token ids, as vLLM returned them
    assert (group["reference_method"], group["is_floor"]) == ("plain", False)
    assert drafting.drafts >= REQUESTS  # the answers came out of the speculative path
    if SPECULATIVE[key]:
        assert drafting.acceptance_length > 1.5
    if floor["divergences"] == 0:
        assert group["divergences"] == 0, group
        assert group["first_divergence"] is None
    else:  # the engine's own noise: no more of it than plain against plain may show
        assert group["divergence_rate"] <= floor["interval_95"][1], (group, floor)
