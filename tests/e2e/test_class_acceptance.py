"""A request class priced from its own acceptance: code accepts more of p-eagle's drafts than
a mixed workload, so once each class has enough requests that reported their speculation,
the `interactive` class (code) pays less than the method's average per output token and the
`batch` class (mixed) more, by the ratio of acceptance lengths the savings report shows; and
the method's total is only redistributed, not changed."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.conftest import (
    ADMIN,
    SIM_MODEL,
    ModuleGatewayStarter,
    ModuleServerStarter,
    Server,
    fleet_backend,
    price_gpu,
    sim_args,
    until,
)

MIN_REQUESTS = 24
WORKLOAD = {"interactive": "code", "batch": "mixed"}  # p-eagle: 3.94 and 3.38 at K=7


@pytest.fixture(scope="module")
def gateway(
    start_module_servers: ModuleServerStarter, start_module_gateway: ModuleGatewayStarter
) -> Server:
    [reporting] = start_module_servers(
        sim_args("--method", "p-eagle", "--per-request-spec-metrics", "--time-scale", "40")
    )
    server, _ = start_module_gateway(
        [fleet_backend("spec-p-eagle", reporting.base_url, "p-eagle")],
        CLASS_ACCEPTANCE_MIN_REQUESTS=str(MIN_REQUESTS),
        REGISTRY_REFRESH_S="0.5",
    )
    price_gpu(server, ["p-eagle"])
    return server


def _ask(gateway: Server, request_class: str) -> str:
    request_id = str(uuid.uuid4())
    client = openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key="none", max_retries=0)
    client.chat.completions.create(
        model=SIM_MODEL,
        messages=[{"role": "user", "content": f"task {request_id}"}],
        max_tokens=96,
        extra_headers={"x-request-id": request_id, "x-draftgate-class": request_class},
        extra_body={"sim_workload": WORKLOAD[request_class]},
    )
    return request_id


def _records(gateway: Server, request_class: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"class": request_class, "limit": 1000}
        if cursor is not None:
            params["cursor"] = cursor
        page = httpx.get(f"{gateway.base_url}/admin/v1/usage", params=params, headers=ADMIN)
        page.raise_for_status()
        rows += page.json()["data"]
        cursor = page.json()["next_cursor"]
        if cursor is None:
            return rows


def _record(gateway: Server, request_class: str, request_id: str) -> dict[str, Any]:
    def mine() -> list[dict[str, Any]]:
        rows = _records(gateway, request_class)
        return [r for r in rows if r["client_request_id"] == request_id]

    return until(mine, f"usage record of {request_id}")[0]


def _by_class(gateway: Server) -> dict[str | None, dict[str, Any]]:
    report = httpx.get(
        f"{gateway.base_url}/admin/v1/savings",
        params={"group_by": "model,method,class"},
        headers=ADMIN,
    )
    report.raise_for_status()
    return {r["request_class"]: r for r in report.json()["data"] if r["method"] == "p-eagle"}


def test_a_class_pays_for_its_own_acceptance(gateway: Server) -> None:
    first = {c: _ask(gateway, c) for c in WORKLOAD}
    with ThreadPoolExecutor(8) as pool:
        # three times the class's minimum: intervals narrow enough to tell 3.94 from 3.38
        list(pool.map(lambda c: _ask(gateway, c), [c for c in WORKLOAD] * 3 * MIN_REQUESTS))
    reported = until(
        lambda: all(
            len([r for r in _records(gateway, c) if r["spec_steps"]]) > MIN_REQUESTS
            for c in WORKLOAD
        ),
        "ledger records of every request",
    )
    assert reported
    for request_class, request_id in first.items():  # too few samples yet: the average
        [record] = [
            r for r in _records(gateway, request_class) if r["client_request_id"] == request_id
        ]
        assert record["acceptance_factor"] is None, record

    def priced() -> dict[str, dict[str, Any]]:
        found = {}
        for request_class in WORKLOAD:
            record = _record(gateway, request_class, _ask(gateway, request_class))
            if record["acceptance_factor"] is not None:
                found[request_class] = record
        return found if len(found) == len(WORKLOAD) else {}

    records = until(priced, "request priced from its class's acceptance")
    rows = _by_class(gateway)
    interactive, batch = rows["interactive"], rows["batch"]
    low, high = interactive["acceptance_length_95"]
    assert batch["acceptance_length_95"][1] < low  # code accepts more, beyond doubt
    assert low <= interactive["acceptance_length"] <= high
    method = _method_length(rows)
    for request_class, record in records.items():
        expected = method / rows[request_class]["acceptance_length"]
        # The snapshot that priced it lagged the report by a refresh: a few requests at most
        assert record["acceptance_factor"] == pytest.approx(expected, rel=0.03), request_class
    assert records["interactive"]["acceptance_factor"] < 1 < records["batch"]["acceptance_factor"]
    # The class's acceptance is uncertain too: its interval widens the cost's beyond the curve's
    for record in records.values():
        assert record["cost_error_usd"] > 0
        assert record["usd_per_mtok"] > 0


def _method_length(rows: dict[str | None, dict[str, Any]]) -> float:
    steps = sum(r["spec_steps"] for r in rows.values())
    accepted = sum(r["accepted_tokens"] for r in rows.values())
    return 1 + accepted / steps
