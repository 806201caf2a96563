"""A key's budget holds over a replica's worker processes: `draftgate gateway --workers 2`
in front of a real-time simulator, 200 requests at once on a budget of a few requests.

Each worker reserves a request's worst case against the key in its own part of a shared file
and reads every worker's reservations and unsnapshotted spend under the file's lock, so the
two workers cannot both spend the key's last dollars. Which worker accepts a connection is
the kernel's choice; every request goes on a fresh connection, and the test checks that both
workers answered some before it trusts its figure."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import (
    ADMIN_TOKEN,
    SIM_MODEL,
    ModuleServerStarter,
    fleet_backend,
    gateway_env,
    sim_args,
    spawn_server,
    write_fleet,
)
from tests.e2e.test_workers import Replica, wait_until

WORKERS = 2
CONCURRENT = 200
BUDGET_REQUESTS = 6  # the budget: this many requests' cost, as one alone costs
MAX_TOKENS = 128  # about 0.3 s each at the simulator's real speed: the admitted ones overlap
LEDGER_WAIT_S = 60.0  # a deadline for the ledger's writes, not a wait
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
PRICE = {"gpu_type": "B200", "usd_per_gpu_hour": 6.0, "source": "test", "date": "2026-12-01"}
BODY = {
    "model": SIM_MODEL,
    "messages": [{"role": "user", "content": "Tell me about speculative decoding."}],
    "max_tokens": MAX_TOKENS,
    "ignore_eos": True,  # every request generates what it reserved: the budget fills up
}


@pytest.fixture(scope="module")
def replica(
    start_module_servers: ModuleServerStarter, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Replica]:
    [plain] = start_module_servers(sim_args("--time-scale", "1"))
    directory = tmp_path_factory.mktemp("budget-workers")
    fleet = write_fleet(directory / "fleet.yaml", [fleet_backend("bw-plain", plain.base_url)])
    state = directory / "state"
    env = gateway_env(f"sqlite:///{directory}/draftgate.db", fleet,
                      REQUIRE_API_KEY="true", WORKER_STATE_DIR=str(state))  # fmt: skip
    gateway = spawn_server(("gateway", "--workers", str(WORKERS)), env, directory)
    try:
        gateway.wait_healthy()
        running = Replica(gateway, state, "", plain)
        wait_until(lambda: len(running.workers()) == WORKERS, "both workers started")
        priced = httpx.post(f"{gateway.base_url}/admin/v1/prices", json=PRICE, headers=ADMIN)
        assert priced.status_code == 201, priced.text  # every worker has it before the answer
        yield running
    finally:
        gateway.close()


def _key(replica: Replica, **limits: object) -> tuple[int, str]:
    """A new API key (every worker knows it when the admin API answers)."""
    created = httpx.post(
        f"{replica.gateway.base_url}/admin/v1/keys", json={"name": "bw", **limits}, headers=ADMIN
    )
    assert created.status_code == 201, created.text
    return created.json()["id"], created.json()["key"]


def _records(replica: Replica, key_id: int, count: int) -> list[dict[str, Any]]:
    """The key's records of served requests, once `count` are written."""
    found: list[dict[str, Any]] = []

    def written() -> bool:
        page = httpx.get(
            f"{replica.gateway.base_url}/admin/v1/usage",
            params={"key": key_id, "limit": 1000},
            headers=ADMIN,
        )
        found[:] = [r for r in page.json()["data"] if r["status_code"] == 200]
        return len(found) >= count

    wait_until(written, f"{count} usage records of key {key_id} written", LEDGER_WAIT_S)
    return found


def _send(http: httpx.Client, url: str, key: str) -> str:
    """One request on a fresh connection: "ok", or the refusal's status and code."""
    answer = http.post(url, json=BODY, headers={"Authorization": f"Bearer {key}"})
    if answer.status_code == 200:
        return "ok"
    return f"{answer.status_code} {answer.json()['error']['code']}"


def test_concurrent_requests_through_two_workers_overrun_a_budget_by_at_most_one_request(
    replica: Replica,
) -> None:
    url = f"{replica.gateway.base_url}/v1/chat/completions"
    limits = httpx.Limits(max_connections=CONCURRENT, max_keepalive_connections=0)
    with httpx.Client(limits=limits, timeout=60.0) as http:
        alone_id, alone = _key(replica)
        assert _send(http, url, alone) == "ok"
        [record] = _records(replica, alone_id, 1)
        per_request = float(record["cost_usd"] or 0.0)
        assert per_request > 0, "requests are not priced: the test would prove nothing"
        budget = BUDGET_REQUESTS * per_request
        key_id, key = _key(replica, budget_usd=budget, budget_period="total")
        answered_before = replica.served_by_pid()  # its 429s are counted too
        with ThreadPoolExecutor(CONCURRENT) as pool:
            statuses = list(pool.map(lambda _: _send(http, url, key), range(CONCURRENT)))
    served = statuses.count("ok")
    assert set(statuses) <= {"ok", "429 insufficient_quota"}, set(statuses)
    answered = replica.served_by_pid()
    by_worker = {pid: answered[pid] - answered_before.get(pid, 0.0) for pid in answered}
    spent = sum(r["cost_usd"] or 0.0 for r in _records(replica, key_id, served))
    print(
        f"\n{CONCURRENT} concurrent requests through {WORKERS} workers "
        f"(answered per worker: {sorted(by_worker.values())}), budget ${budget:.6f} "
        f"(~{BUDGET_REQUESTS} requests): served {served}, spent ${spent:.6f}, "
        f"{spent / budget:.2f}x the budget"
    )
    assert all(by_worker.get(pid, 0.0) > 0 for pid in replica.workers()), by_worker
    assert spent <= budget + per_request
    assert spent >= budget / 3  # the budget is reached, not refused outright
