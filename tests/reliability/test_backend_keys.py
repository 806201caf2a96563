"""Backends that require a key (vLLM's `--api-key`): write-only, sent by every caller.

A simulator started with `--api-key` refuses /v1 routes without it, as vLLM does. The
gateway's backend carries the key (from `fleet.yaml`): the relay, the prober's context-length
probe (`/v1/models`) and the benchmark runner send it; the admin API, the audit log and the
process's output never show it. A wrong key is the gateway's failure (502, failed over),
never a 401 handed to a client whose own key was fine. In the database it is sealed
(DRAFTGATE_SECRETS_KEY): a dump of it holds no key, and a gateway without that key does
not start.
"""

from __future__ import annotations

import time
from typing import Any

import httpx

from gateway.db.sealed import new_key
from tests.e2e.conftest import query_rows
from tests.reliability.conftest import ADMIN_TOKEN, Processes, fleet_backend

MODEL = "reliability/keyed"
SECRET = "sk-backend-0123456789abcdef"
WRONG = "sk-backend-wrong"
SEALING_KEY = new_key()  # DRAFTGATE_SECRETS_KEY: backend keys sealed in the database
WAIT_S = 30.0
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def wait_run(admin: httpx.Client, run_id: int) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT_S
    while (run := admin.get(f"/admin/v1/benchmarks/{run_id}").json())["status"] not in (
        "succeeded",
        "failed",
    ):
        assert time.monotonic() < deadline, run
        time.sleep(0.1)
    result: dict[str, Any] = run
    return result


def test_a_backend_key_is_sent_by_every_caller_and_shown_to_no_one(
    database_url: str, processes: Processes
) -> None:
    keyed = processes.sim("--time-scale", "50", "--api-key", SECRET, model=MODEL)
    assert httpx.post(f"{keyed.base_url}/v1/chat/completions", json=BODY).status_code == 401
    gateway = processes.gateway(
        database_url,
        [fleet_backend("keyed-1", keyed.base_url, model=MODEL, api_key=SECRET)],
        SECRETS_KEY=SEALING_KEY,
    )
    with gateway.client(ADMIN_TOKEN) as admin:
        answer = httpx.post(f"{gateway.base_url}/v1/chat/completions", json=BODY, timeout=30)
        assert answer.status_code == 200, answer.text
        deadline = time.monotonic() + WAIT_S  # the prober learns the context length via /v1
        while not admin.get("/admin/v1/backends/keyed-1").json()["runtime"]["max_model_len"]:
            assert time.monotonic() < deadline, "the context length was never probed"
            time.sleep(0.1)
        body = {"backend": "keyed-1", "concurrency": [1], "requests_per_level": 3}
        run = wait_run(admin, admin.post("/admin/v1/benchmarks", json=body).json()["id"])
        assert run["status"] == "succeeded", run
        assert run["result"]["levels"][0]["completed"] == 3

        shown = admin.get("/admin/v1/backends/keyed-1").json()
        assert shown["has_api_key"] is True
        wrong = admin.patch("/admin/v1/backends/keyed-1", json={"api_key": WRONG})
        assert wrong.status_code == 200, wrong.text
        deadline = time.monotonic() + WAIT_S  # until the registry holds the wrong key
        while (refused := httpx.post(f"{gateway.base_url}/v1/chat/completions", json=BODY,
                                     timeout=30)).status_code == 200:  # fmt: skip
            assert time.monotonic() < deadline, "the new key was never used"
            time.sleep(0.1)
        everything = [
            admin.get("/admin/v1/backends").text,
            admin.get("/admin/v1/audit").text,
            admin.get("/admin/v1/benchmarks").text,
            refused.text,
        ]
    print(f"\nbackend keys: a wrong key answers {refused.status_code} {refused.json()['error']}")
    assert refused.status_code == 502
    assert "credentials" in refused.json()["error"]["message"]
    dump = query_rows(database_url, "SELECT * FROM backends")  # what a copy of the database holds
    for text in [*everything, gateway.output(), repr(dump)]:
        assert SECRET not in text
        assert WRONG not in text
    assert dump[0]["api_key"].startswith("sealed:")


def test_a_gateway_without_the_key_its_database_was_sealed_with_does_not_start(
    database_url: str, processes: Processes
) -> None:
    keyed = processes.sim("--time-scale", "50", "--api-key", SECRET, model=MODEL)
    fleet = [fleet_backend("keyed-1", keyed.base_url, model=MODEL, api_key=SECRET)]
    first = processes.gateway(database_url, fleet, SECRETS_KEY=SEALING_KEY)
    first.close()
    second = processes.gateway(database_url, [], wait=False)
    assert second.process.wait(timeout=60) != 0
    assert "no DRAFTGATE_SECRETS_KEY (or DRAFTGATE_SECRETS_KEY_FILE) is set" in second.output()
    assert SECRET not in second.output()
