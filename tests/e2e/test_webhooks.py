"""Webhooks from a real gateway to a real receiver: a budget passing its thresholds, a
backend whose counters contradict its method, a backend going down and coming back, and the
automatic moves that follow, each arriving signed, with retries when the receiver fails.

The gateway fronts a plain and a P-EAGLE simulator of one `auto` model, and a P-EAGLE
simulator declared plain (another model). Every wait is a condition with a deadline; "once"
is judged by order: one receiver gets its events in the order they were sent, so a repeat of
an event would have arrived before the later event the test waits for.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import (
    ADMIN_TOKEN,
    SIM_MODEL,
    ModuleGatewayStarter,
    Server,
    draftgate_env,
    fleet_backend,
    free_port,
    metric_value,
    sim_args,
    spawn_server,
)
from tests.webhook_receiver import Receiver, running_receiver

SECRET = "whsec-0123456789abcdef-e2e"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
MISLABELLED = "acme/mislabelled"
DEADLINE_S = 90.0  # a deadline for the gateway to notice and send, not a wait
SETTINGS = {
    "REQUIRE_API_KEY": "true",
    "WEBHOOK_SECRET": SECRET,
    "WEBHOOK_BACKOFF_S": "0.05",
    "WEBHOOK_BUDGET_THRESHOLDS": "0.5,0.8",
    "REGISTRY_REFRESH_S": "0.5",
    "COLLECT_INTERVAL_S": "0.5",
    "SELECTOR_INTERVAL_S": "0.3",
    "SELECTOR_MIN_DWELL_S": "0",
    "SELECTOR_SWITCH_MARGIN": "0",
    "MOVE_STEP_SHARE": "1",
}
CHAT = [{"role": "user", "content": "Tell me about speculative decoding."}]
# Long answers: a request's reservation (its prompt estimate and every token it may ask for,
# at the dearest price) is then near what it costs, so a key can spend up to 80% of a budget
# of BUDGET_REQUESTS requests before its next one no longer fits.
ANSWER_TOKENS = 256
BUDGET_REQUESTS = 20
Events = list[dict[str, Any]]


@dataclass
class Stack:
    gateway: Server
    receiver: Receiver
    sims: dict[str, Server]  # by method, of SIM_MODEL
    log_dir: Path

    def key(self, **limits: Any) -> tuple[int, str]:
        body = {"name": "budget-team", **limits}
        created = httpx.post(f"{self.gateway.base_url}/admin/v1/keys", json=body, headers=ADMIN)
        assert created.status_code == 201, created.text
        return created.json()["id"], created.json()["key"]

    def chat(self, key: str) -> httpx.Response:
        body = {"model": SIM_MODEL, "messages": CHAT, "max_tokens": ANSWER_TOKENS}
        headers = {"Authorization": f"Bearer {key}"}
        url = f"{self.gateway.base_url}/v1/chat/completions"
        return httpx.post(url, json=body, headers=headers, timeout=30.0)

    def spent(self, key_id: int, requests: int) -> float:
        """The key's spend in the ledger, once its `requests` records are written."""
        found: list[float] = []

        def written() -> bool:
            params: dict[str, str | int] = {"key": key_id, "limit": 1000}
            url = f"{self.gateway.base_url}/admin/v1/usage"
            page = httpx.get(url, params=params, headers=ADMIN).json()["data"]
            found[:] = [r["cost_usd"] or 0.0 for r in page]
            return len(found) >= requests

        until(written, f"{requests} usage records of key {key_id} were not written")
        return sum(found)

    def restart(self, method: str) -> None:
        """Start `method`'s simulator again on its port (its backend's URL)."""
        old = self.sims[method]
        old.close()
        self.sims[method] = spawn_server(old_args(method), draftgate_env(), self.log_dir, old.port)
        self.sims[method].wait_healthy()


def until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {DEADLINE_S} s")
        time.sleep(0.1)


def old_args(method: str) -> tuple[str, ...]:
    options = ("--method", "p-eagle", "--k", "7") if method == "p-eagle" else ()
    return sim_args(*options, "--time-scale", "50")


@pytest.fixture(scope="module")
def stack(
    start_module_gateway: ModuleGatewayStarter, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    log_dir = tmp_path_factory.mktemp("sims")
    env = draftgate_env()
    sims = {m: spawn_server(old_args(m), env, log_dir, free_port()) for m in ("plain", "p-eagle")}
    mislabelled = spawn_server(
        sim_args("--method", "p-eagle", "--k", "7", "--served-model-name", MISLABELLED),
        env,
        log_dir,
    )
    try:
        for sim in (*sims.values(), mislabelled):
            sim.wait_healthy()
        with running_receiver(SECRET) as receiver:
            backends = [
                fleet_backend("sim-plain", sims["plain"].base_url),
                fleet_backend("sim-p-eagle", sims["p-eagle"].base_url, "p-eagle"),
                fleet_backend("sim-mislabelled", mislabelled.base_url, model=MISLABELLED),
            ]
            gateway, _ = start_module_gateway(backends, WEBHOOK_URLS=receiver.url, **SETTINGS)
            price = {"gpu_type": "B200", "usd_per_gpu_hour": 6.0, "source": "test",
                     "date": "2026-11-01"}  # fmt: skip
            created = httpx.post(f"{gateway.base_url}/admin/v1/prices", json=price, headers=ADMIN)
            assert created.status_code == 201, created.text
            yield Stack(gateway, receiver, sims, log_dir)
    finally:
        for sim in (*sims.values(), mislabelled):
            sim.close()


def of_type(events: Events, event_type: str, **fields: object) -> Events:
    return [e for e in events if e["type"] == event_type and fields.items() <= e.items()]


def test_a_budget_sends_each_threshold_once_as_it_is_passed(stack: Stack) -> None:
    probe_id, probe_key = stack.key()
    assert stack.chat(probe_key).status_code == 200
    per_request = stack.spent(probe_id, 1)
    assert per_request > 0, "requests are not priced: no budget could be passed"
    budget = BUDGET_REQUESTS * per_request
    key_id, key = stack.key(budget_usd=budget, budget_period="total")
    sent = 0
    while stack.spent(key_id, sent) < 0.8 * budget:  # one request at a time, each recorded
        response = stack.chat(key)
        assert response.status_code == 200, response.text
        sent += 1
        assert sent <= 2 * BUDGET_REQUESTS, "the budget was not passed"

    def mine(events: Events) -> Events:
        return [e for e in of_type(events, "budget.threshold") if e["data"]["key_id"] == key_id]

    events = stack.receiver.wait_for(
        lambda es: any(e["data"]["threshold"] == 0.8 for e in mine(es)),
        "budget.threshold 0.8 did not arrive",
    )
    mine = mine(events)
    assert [e["data"]["threshold"] for e in mine] == [0.5, 0.8]  # each once, in order
    for event in mine:
        data = event["data"]
        assert (data["key_name"], data["budget_period"]) == ("budget-team", "total")
        assert data["budget_usd"] == pytest.approx(budget)
        assert data["period_start"] is None
        assert data["spent_usd"] >= data["threshold"] * budget
        assert data["fraction"] == pytest.approx(data["spent_usd"] / budget, abs=1e-6)
    assert len({e["id"] for e in mine}) == 2
    assert not any(key in r.body.decode() for r in stack.receiver.received)  # never the secret
    assert all(r.signed for r in stack.receiver.received)


def test_a_backend_whose_counters_contradict_its_method_is_reported(stack: Stack) -> None:
    events = stack.receiver.wait_for(
        lambda es: bool(of_type(es, "backend.mismatch", backend="sim-mislabelled")),
        "backend.mismatch did not arrive",
    )
    [event] = of_type(events, "backend.mismatch")  # once, however many scrapes saw it
    assert event["model"] == MISLABELLED
    assert event["data"] == {
        "method": "plain",
        "reason": "declared plain but exposes spec-decode counters",
    }
    assert all(r.signed for r in stack.receiver.received)


def test_a_backend_going_down_and_up_moves_the_model_off_it_and_back(stack: Stack) -> None:
    stack.receiver.wait_for(  # the event the gateway sends at start is out of the way
        lambda es: bool(of_type(es, "backend.mismatch")), "backend.mismatch did not arrive"
    )
    _, key = stack.key()
    first = stack.chat(key).headers["x-draftgate-method"]  # the auto choice now
    second = "plain" if first == "p-eagle" else "p-eagle"
    down_backend = f"sim-{first}"
    stack.receiver.fail(2)  # the next event is refused twice before it is taken
    before = len(stack.receiver.received)
    assert stack.sims[first].stop(signal.SIGTERM) == 0

    events = stack.receiver.wait_for(
        lambda es: bool(of_type(es, "method.moved", model=SIM_MODEL)
                        and of_type(es, "backend.down", backend=down_backend)),
        f"backend.down of {down_backend} and a move off it did not arrive",
    )  # fmt: skip
    [down] = of_type(events, "backend.down")
    assert (down["model"], down["data"]["method"]) == (SIM_MODEL, first)
    assert down["data"]["probe"] in ("down", "slow")  # refused, or silent while it stopped
    attempts = [r for r in stack.receiver.received[before:] if r.event["id"] == down["id"]]
    assert [a.status for a in attempts] == [500, 500, 204]  # retried, and still signed
    [off] = of_type(events, "method.moved")
    assert (off["data"]["before"], off["data"]["after"]) == (first, second)
    assert [c["method"] for c in off["data"]["candidates"]] == [second]  # the only healthy one

    stack.restart(first)
    events = stack.receiver.wait_for(
        lambda es: (
            len(of_type(es, "method.moved")) >= 2
            and bool(of_type(es, "backend.up", backend=down_backend))
        ),
        f"backend.up of {down_backend} and a move back did not arrive",
    )
    [up] = of_type(events, "backend.up")
    assert (up["data"]["method"], up["data"]["probe"]) == (first, "healthy")
    back = of_type(events, "method.moved")[1]
    data = back["data"]
    assert (data["before"], data["after"], data["request_class"]) == (second, first, None)
    prices = {c["method"]: c["usd_per_mtok"] for c in data["candidates"]}
    assert set(prices) == {"plain", "p-eagle"}
    assert prices[first] < prices[second]  # moved to the cheaper, both priced
    assert data["candidates"][0]["method"] == first  # cheapest first
    assert all(c["curve_source"] in ("measured", "estimated", None) for c in data["candidates"])
    assert data["concurrency"] >= 0
    assert [e["type"] for e in events].count("backend.down") == 1
    sent = metric_value(
        stack.gateway.base_url,
        "draftgate_webhook_events_total",
        type="method.moved",
        outcome="sent",
    )
    assert sent == 2
    assert all(r.signed for r in stack.receiver.received)
