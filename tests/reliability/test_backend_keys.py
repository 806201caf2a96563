"""Backends that require a key (vLLM's `--api-key`): write-only, sent by every caller.

A simulator started with `--api-key` refuses /v1 routes without it, as vLLM does. The
gateway's backend carries the key (from `fleet.yaml`): the relay, the prober's context-length
probe (`/v1/models`) and the benchmark runner send it; the admin API, the audit log and the
process's output never show it. A wrong key is the gateway's failure (502, failed over),
never a 401 handed to a client whose own key was fine.
"""

from __future__ import annotations

import time
from typing import Any

import httpx

from tests.reliability.conftest import ADMIN_TOKEN, Processes, fleet_backend

MODEL = "reliability/keyed"
SECRET = "sk-backend-0123456789abcdef"
WRONG = "sk-backend-wrong"
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
        database_url, [fleet_backend("keyed-1", keyed.base_url, model=MODEL, api_key=SECRET)]
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
    for text in [*everything, gateway.output()]:
        assert SECRET not in text
        assert WRONG not in text
