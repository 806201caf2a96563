"""The lossless watchdog end to end: a real gateway samples greedy requests served by a
simulated DSpark backend, replays each on a simulated plain backend through its own relay,
and compares the answers. The simulators answer every method alike (the target's tokens,
greedy) unless told to diverge (`POST /sim/faults`: a share of answers leave the target's
tokens at a given token), so a clean fleet must show 0 divergences and a lossy one its set
rate, within the report's interval. On SQLite and PostgreSQL."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import httpx
import openai
import pytest

from tests.e2e.conftest import (
    ADMIN_TOKEN,
    SIM_MODEL,
    ModuleServerStarter,
    Server,
    fleet_backend,
    gateway_env,
    metric_value,
    sim_args,
    spawn_server,
    write_fleet,
)
from tests.webhook_receiver import Receiver, running_receiver

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
WAIT_S = 90.0  # a deadline for the replays and their writes, not a wait
ANSWER_TOKENS = 24
DIVERGE_AT = 5  # the token from which a lossy answer differs
DIVERGE_RATE = 0.5
LOSSY = 60  # requests sent while DSpark is lossy
POLICY = {"mode": "pinned", "method": "dspark", "lossless_quarantine": True}
SECRET = "whsec-lossless-e2e"
SETTINGS = {
    "REQUIRE_API_KEY": "true",
    "LOSSLESS_SAMPLE_SHARE": "1",
    "LOSSLESS_MAX_PER_MINUTE": "10000",
    "LOSSLESS_QUEUE": "1000",
    "LOSSLESS_QUARANTINE_MIN_CHECKS": "40",
    "LOSSLESS_QUARANTINE_INTERVAL_S": "0.5",
    "WEBHOOK_SECRET": SECRET,
}


@dataclass
class Stack:
    gateway: Server
    plain: Server
    dspark: Server
    key: str  # an ordinary key
    private_key: str  # a key that opted out of replays
    receiver: Receiver  # the webhooks' receiver
    clients: dict[str, openai.OpenAI] = field(default_factory=dict)  # one per key, closed

    def client(self, key: str | None = None) -> openai.OpenAI:
        key = key or self.key
        if key not in self.clients:
            url = f"{self.gateway.base_url}/v1"
            self.clients[key] = openai.OpenAI(base_url=url, api_key=key, max_retries=0)
        return self.clients[key]

    def close(self) -> None:
        for client in self.clients.values():
            client.close()

    def report(self) -> dict[str, Any]:
        response = httpx.get(
            f"{self.gateway.base_url}/admin/v1/lossless",
            params={"model": SIM_MODEL},
            headers=ADMIN,
            timeout=10.0,
        )
        assert response.status_code == 200, response.text
        [model] = response.json()["models"] or [{"groups": [], "floor": None, "replays": None}]
        return dict(model)

    def pin(self, method: str) -> None:
        url = f"{self.gateway.base_url}/admin/v1/models/{SIM_MODEL}/policy"
        policy = POLICY | {"method": method}
        response = httpx.put(
            url, json=policy, params={"immediate": "true"}, headers=ADMIN, timeout=10.0
        )
        assert response.status_code == 200, response.text
        self._until(lambda: self._serves(method), f"{method} serves")

    def _serves(self, method: str) -> bool:
        response = self.client().chat.completions.with_raw_response.create(
            model=SIM_MODEL, messages=[{"role": "user", "content": "which?"}], max_tokens=1
        )
        return response.headers["x-draftgate-method"] == method

    def group(self, method: str) -> dict[str, Any]:
        """The report's group of `method` now (no checks yet: an empty one)."""
        groups = [g for g in self.report()["groups"] if g["method"] == method]
        return groups[0] if groups else {"samples": 0, "divergences": 0}

    def checked(self, method: str, samples: int) -> dict[str, Any]:
        """The report's group of `method` once it holds `samples` checks."""
        found: list[dict[str, Any]] = []

        def enough() -> bool:
            groups = [g for g in self.report()["groups"] if g["method"] == method]
            found[:] = groups
            return sum(int(g["samples"]) for g in groups) >= samples

        self._until(enough, f"{samples} checks of {method} (report: {self.report()})")
        [group] = found
        return group

    def settled(self) -> tuple[float, int]:
        """The checks so far, once every replay's usage record is written (the ledger
        writes in batches): (checks, replays)."""
        found: list[tuple[float, int]] = []

        def written() -> bool:
            checks = metric_value(self.gateway.base_url, "draftgate_lossless_checks_total")
            found[:] = [(checks, self.report()["replays"]["requests"])]
            return found[0][1] == checks

        self._until(written, "every replay's record")
        return found[0]

    @staticmethod
    def _until(check: Any, what: str) -> None:
        deadline = time.monotonic() + WAIT_S
        while not check():
            if time.monotonic() > deadline:
                pytest.fail(f"not within {WAIT_S} s: {what}")
            time.sleep(0.2)


def _key(gateway: Server, **fields: Any) -> str:
    created = httpx.post(
        f"{gateway.base_url}/admin/v1/keys",
        json={"name": f"k-{uuid.uuid4().hex[:6]}", **fields},
        headers=ADMIN,
        timeout=10.0,
    )
    assert created.status_code == 201, created.text
    return str(created.json()["key"])


@pytest.fixture(scope="module")
def stack(
    module_database: str,
    start_module_servers: ModuleServerStarter,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stack]:
    fast = ("--time-scale", "20")
    plain, dspark = start_module_servers(sim_args(*fast), sim_args("--method", "dspark", *fast))
    log_dir = tmp_path_factory.mktemp("gateway")
    fleet = write_fleet(
        log_dir / "fleet.yaml",
        [
            fleet_backend("b-plain", plain.base_url),
            fleet_backend("b-dspark", dspark.base_url, "dspark", k=5),
        ],
        [{"name": SIM_MODEL, "policy": POLICY}],
    )
    with running_receiver(SECRET) as receiver:
        settings = SETTINGS | {"WEBHOOK_URLS": receiver.url}
        gateway = spawn_server(
            ("gateway",), gateway_env(module_database, fleet, **settings), log_dir
        )
        try:
            gateway.wait_healthy()
            _versions_known(gateway)
            keys = _key(gateway), _key(gateway, lossless_opt_out=True)
            stack = Stack(gateway, plain, dspark, *keys, receiver)
            yield stack
            stack.close()
        finally:
            gateway.close()


def _versions_known(gateway: Server) -> None:
    """Wait until the gateway has read each backend's engine version: checks are grouped by
    it, and a check made before the first read would stand in a group of its own."""

    def known() -> bool:
        backends = httpx.get(f"{gateway.base_url}/admin/v1/backends", headers=ADMIN).json()
        return all((b.get("runtime") or {}).get("engine_version") for b in backends["data"])

    Stack._until(known, "the backends' engine versions")


def _ask(client: openai.OpenAI, n: int, stream: bool = False, **sampling: Any) -> None:
    for i in range(n):
        messages = [{"role": "user", "content": f"question {uuid.uuid4().hex} {i}"}]
        extra = {"ignore_eos": True}
        if stream:
            events = client.chat.completions.create(
                model=SIM_MODEL, messages=messages, max_tokens=ANSWER_TOKENS,  # type: ignore[arg-type]
                stream=True, extra_body=extra, **sampling,
            )  # fmt: skip
            for _ in cast("openai.Stream[Any]", events):
                pass
        else:
            client.chat.completions.create(
                model=SIM_MODEL, messages=messages, max_tokens=ANSWER_TOKENS,  # type: ignore[arg-type]
                extra_body=extra, **sampling,
            )  # fmt: skip


def _faults(sim: Server, **switches: float) -> None:
    response = httpx.post(f"{sim.base_url}/sim/faults", json=switches, timeout=10.0)
    assert response.status_code == 200, response.text


def test_a_clean_speculative_backend_shows_no_divergence(stack: Stack) -> None:
    client = stack.client()
    _ask(client, 10, temperature=0)
    _ask(client, 10, stream=True, temperature=0)
    group = stack.checked("dspark", 20)
    print(f"\nclean DSpark against plain: {group}")
    assert (group["samples"], group["divergences"]) == (20, 0)
    assert group["reference_method"] == "plain"
    assert group["interval_95"][0] == 0.0 < group["interval_95"][1] < 0.2
    assert group["first_divergence"] is None


def test_answers_not_greedy_or_from_a_key_that_opted_out_are_never_replayed(
    stack: Stack,
) -> None:
    before, replays = stack.settled()
    _ask(stack.client(), 5, temperature=0.7)
    _ask(stack.client(), 5, temperature=0.7, seed=7)  # seeded, but sampled: not comparable
    _ask(stack.client(), 5)  # no temperature: the engine's default samples
    _ask(stack.client(stack.private_key), 5, temperature=0)
    _ask(stack.client(), 1, temperature=0)  # a sampled one after them: its check marks the end
    stack._until(
        lambda: (
            metric_value(stack.gateway.base_url, "draftgate_lossless_checks_total") >= before + 1
        ),
        "the last request's check",
    )
    assert metric_value(stack.gateway.base_url, "draftgate_lossless_checks_total") == before + 1
    # the queue is first in, first out: the last request's check came after any other's
    stack._until(lambda: stack.report()["replays"]["requests"] > replays, "its replay's record")
    assert stack.report()["replays"]["requests"] == replays + 1


def test_a_lossy_speculative_backend_is_caught_at_its_rate_and_where_it_diverges(
    stack: Stack,
) -> None:
    before = stack.group("dspark")
    _faults(stack.dspark, diverge_rate=DIVERGE_RATE, diverge_at=DIVERGE_AT)
    try:
        _ask(stack.client(), LOSSY // 2, temperature=0)
        _ask(stack.client(), LOSSY // 2, stream=True, temperature=0)
    finally:
        _faults(stack.dspark, diverge_rate=0)
    group = stack.checked("dspark", before["samples"] + LOSSY)
    diverged = group["divergences"] - before["divergences"]
    print(f"\nlossy DSpark (rate {DIVERGE_RATE} from token {DIVERGE_AT}): {group}")
    low, high = group["interval_95"]
    assert 0 < diverged < LOSSY
    assert group["divergences"] == diverged  # the clean checks before diverged nowhere
    # the set rate over the lossy requests, and the whole group's interval holds that share
    share = LOSSY * DIVERGE_RATE / group["samples"]
    assert low <= share <= high, (low, share, high)
    # compared by token ids (the engine returned them): the first DIVERGE_AT tokens are
    # kept, so each answer differs from that token on (or later, where a new token happens
    # to be the old one)
    first = group["first_divergence"]
    assert first["unit"] == "token"
    assert DIVERGE_AT <= first["min"] <= first["max"] < ANSWER_TOKENS
    _quarantined_yet_pinned(stack)


def _quarantined_yet_pinned(stack: Stack) -> None:
    """The model's policy asks for quarantines: DSpark is taken out of auto's choices with
    the evidence, audited and sent as a webhook; pinned, it still serves."""
    [event] = [
        e
        for e in stack.receiver.wait_for(
            lambda events: any(e["type"] == "method.quarantined" for e in events),
            "the quarantine's webhook",
        )
        if e["type"] == "method.quarantined"
    ]
    assert (event["model"], event["data"]["method"]) == (SIM_MODEL, "dspark")
    evidence = event["data"]["evidence"]
    assert evidence["divergences"] >= 1
    assert evidence["interval_95"][0] > 0.02
    quarantines = httpx.get(
        f"{stack.gateway.base_url}/admin/v1/lossless/quarantines", headers=ADMIN, timeout=10.0
    ).json()["data"]
    assert [(q["method"], q["id"]) for q in quarantines] == [
        ("dspark", event["data"]["quarantine_id"])
    ]
    audit = httpx.get(
        f"{stack.gateway.base_url}/admin/v1/audit",
        params={"resource_type": "quarantine"},
        headers=ADMIN,
        timeout=10.0,
    ).json()["data"]
    assert [(e["actor"], e["action"]) for e in audit] == [("lossless-watchdog", "quarantine")]
    assert stack._serves("dspark")  # pinned: never overridden
    lifted = httpx.delete(
        f"{stack.gateway.base_url}/admin/v1/lossless/quarantines/{quarantines[0]['id']}",
        headers=ADMIN,
        timeout=10.0,
    )
    assert lifted.status_code == 200, lifted.text


def test_the_token_ids_asked_for_a_replay_reach_no_client_that_did_not_ask(
    stack: Stack,
) -> None:
    """Every request is sampled here, so each asks the engine for its token ids; a client
    gets them only when it asked too: whole, streamed, chat and text completions."""
    url, headers = stack.gateway.base_url, {"Authorization": f"Bearer {stack.key}"}
    chat = {"messages": [{"role": "user", "content": "ids?"}]}
    text = {"prompt": "ids?"}
    for path, request in (("/v1/chat/completions", chat), ("/v1/completions", text)):
        for stream in (False, True):
            body = {"model": SIM_MODEL, "max_tokens": 6, "temperature": 0, "stream": stream}
            plain = _choices(httpx.post(f"{url}{path}", json=body | request, headers=headers))
            asked = body | request | {"return_token_ids": True}
            given = _choices(httpx.post(f"{url}{path}", json=asked, headers=headers))
            assert all(c.get("token_ids") is None for c in plain), (path, stream, plain)
            assert all(c.get("prompt_token_ids") is None for c in plain), (path, stream)
            ids = [i for c in given for i in c.get("token_ids") or ()]
            assert len(ids) == 6, (path, stream, given)


def _choices(response: httpx.Response) -> list[dict[str, Any]]:
    """Every choice a response carried, whole or in its stream's chunks; each body's
    `prompt_token_ids` set on its choices, where it has them."""
    assert response.status_code == 200, response.text
    if not response.headers["content-type"].startswith("text/event-stream"):
        bodies = [response.json()]
    else:
        lines = response.text.splitlines()
        data = [line[6:] for line in lines if line.startswith("data: ") and "[DONE]" not in line]
        bodies = [json.loads(line) for line in data]
    return [
        {"prompt_token_ids": b.get("prompt_token_ids")} | c for b in bodies for c in b["choices"]
    ]


def test_plain_against_plain_is_the_floor_beside_every_rate(stack: Stack) -> None:
    stack.pin("plain")
    try:
        _ask(stack.client(), 10, temperature=0)
        floor_group = stack.checked("plain", 10)
    finally:
        stack.pin("dspark")
    report = stack.report()
    assert floor_group["is_floor"] is True
    assert floor_group["divergences"] == 0
    floor = report["floor"]
    assert floor["samples"] >= 10
    assert floor["divergences"] == 0
    replays = report["replays"]
    assert replays["requests"] >= floor["samples"]
    assert replays["cost_usd"] is None or replays["cost_usd"] >= 0


def test_each_replay_is_a_request_of_its_own_class_in_the_ledger(stack: Stack) -> None:
    records = httpx.get(
        f"{stack.gateway.base_url}/admin/v1/usage",
        params={"limit": 1000},
        headers=ADMIN,
        timeout=10.0,
    ).json()["data"]
    replays = [r for r in records if r["request_class"] == "lossless-replay"]
    assert replays, "no replay in the ledger"
    assert {r["method"] for r in replays} == {"plain"}
    assert all(r["api_key_id"] is None for r in replays)
    assert all(r["status_code"] == 200 for r in replays)
