"""Admin API for benchmark runs: what a request may ask for (runs themselves are e2e)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.api.test_admin_backends import assert_envelope


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"poisson": True}, "poisson", "give rate_per_s"),
        ({"rate_per_s": 5, "burstiness": 0.5}, "burstiness", "set poisson"),
        ({"rate_per_s": 0}, "rate_per_s", "greater than 0"),
        ({"rate_per_s": 5, "poisson": True, "burstiness": -1}, "burstiness", "greater than 0"),
        ({"workload": "poetry"}, "workload", "'synthetic', 'code', 'chat' or 'math'"),
        ({"workload": "code", "output_len": 0}, "output_len", "greater than or equal to 1"),
        ({"seed": -1}, "seed", "greater than or equal to 0"),
        ({"rate": 5}, "rate", "Extra inputs are not permitted"),
        ({"duration_s": 5, "requests_per_client": 8}, "requests_per_client", "requests_per_level"),
    ],
)
async def test_benchmark_options_that_make_no_sense_are_422(
    client: httpx.AsyncClient, body: dict[str, Any], param: str, message: str
) -> None:
    response = await client.post("/admin/v1/benchmarks", json={"backend": "sim", **body})
    assert message in assert_envelope(response, 422, param)
    assert response.json()["error"]["type"] == "invalid_request_error"


async def test_a_sweep_runs_enough_requests_per_client_by_default(
    client: httpx.AsyncClient,
) -> None:
    sim = {"name": "sim", "url": "http://127.0.0.1:9", "model": "m", "method": "plain"}
    assert (await client.post("/admin/v1/backends", json=sim)).status_code == 201
    run = (await client.post("/admin/v1/benchmarks", json={"backend": "sim"})).json()
    assert (run["params"]["requests_per_level"], run["params"]["requests_per_client"]) == (50, 8)
    exact = {"backend": "sim", "requests_per_level": 6}
    run = (await client.post("/admin/v1/benchmarks", json=exact)).json()
    assert (run["params"]["requests_per_level"], run["params"]["requests_per_client"]) == (6, None)
