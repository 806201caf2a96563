"""`draftgate bench` against a real simulator: client figures, acceptance from /metrics,
measurements stored, and a vllm-bench JSON that imports back."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from backends.sim.config import SimConfig, acceptance_profile
from tests.e2e.conftest import (
    ADMIN_TOKEN,
    SIM_MODEL,
    CliRunner,
    ModuleGatewayStarter,
    ModuleServerStarter,
    draftgate_env,
    fleet_backend,
    query_rows,
    sim_args,
)


def test_bench_sweep_stores_measurements_and_saves_vllm_bench_json(
    run_cli: CliRunner, start_module_servers: ModuleServerStarter, tmp_path: Path
) -> None:
    [sim] = start_module_servers(sim_args("--method", "p-eagle", "--k", "7", "--time-scale", "20"))
    database_url = f"sqlite:///{tmp_path}/bench.db"
    env = draftgate_env(DRAFTGATE_DATABASE_URL=database_url)
    saved = tmp_path / "result.json"
    done = run_cli("bench", "--url", sim.base_url, "--model", SIM_MODEL, "--concurrency", "1,4",
                   "--requests", "12", "--output-len", "48", "--save-result", str(saved),
                   "--method", "p-eagle", "--k", "7", "--gpu", "B200", env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = query_rows(database_url, "SELECT * FROM measurements ORDER BY concurrency")
    assert [(r["concurrency"], r["source"], r["method"]) for r in rows] == [
        (1.0, "bench", "p-eagle"), (4.0, "bench", "p-eagle")]  # fmt: skip
    assert rows[1]["output_tokens_per_s"] > rows[0]["output_tokens_per_s"] > 0
    profile = acceptance_profile(SimConfig(model=SIM_MODEL, method="p-eagle", k=7))
    assert profile is not None
    assert rows[0]["mean_acceptance_length"] == pytest.approx(
        profile.mean_acceptance_length(7), rel=0.2)  # fmt: skip

    result = json.loads((tmp_path / "result-c4.json").read_text())
    assert (result["max_concurrency"], result["completed"], result["failed"]) == (4, 12, 0)
    assert result["total_output_tokens"] == 12 * 48
    assert result["mean_ttft_ms"] > 0
    assert result["spec_decode_acceptance_length"] > 1
    imported = run_cli("import", "vllm-bench", str(tmp_path / "result-c4.json"), "--method",
                       "p-eagle", "--k", "7", "--gpu", "B200", env=env)  # fmt: skip
    assert imported.returncode == 0, imported.stderr
    assert len(query_rows(database_url, "SELECT id FROM measurements")) == 3


def test_benchmarks_through_the_admin_api_run_in_the_background(
    start_module_servers: ModuleServerStarter, start_module_gateway: ModuleGatewayStarter
) -> None:
    [sim] = start_module_servers(sim_args("--method", "p-eagle", "--k", "7", "--time-scale", "20"))
    server, database_url = start_module_gateway([fleet_backend("sim-peagle", sim.base_url,
                                                               "p-eagle")])  # fmt: skip
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    with httpx.Client(base_url=server.base_url, headers=admin, timeout=10) as http:
        body = {"backend": "sim-peagle", "concurrency": [1, 2], "requests_per_level": 6,
                "output_len": 32}  # fmt: skip
        started = http.post("/admin/v1/benchmarks", json=body)
        assert started.status_code == 202, started.text
        run = _wait_for(http, started.json()["id"], {"succeeded", "failed"})
        assert run["status"] == "succeeded", run
        assert run["progress"] == 1.0
        assert [lvl["concurrency"] for lvl in run["result"]["levels"]] == [1, 2]
        assert all(lvl["completed"] == 6 for lvl in run["result"]["levels"])
        rows = query_rows(database_url, "SELECT * FROM measurements WHERE source = 'bench'")
        assert sorted((r["concurrency"], r["method"], r["backend_name"]) for r in rows) == [
            (1.0, "p-eagle", "sim-peagle"), (2.0, "p-eagle", "sim-peagle")]  # fmt: skip

        long = http.post("/admin/v1/benchmarks", json={"backend": "sim-peagle",
                                                       "duration_s": 60}).json()  # fmt: skip
        _wait_for(http, long["id"], {"running"})
        assert http.delete(f"/admin/v1/benchmarks/{long['id']}").status_code == 200
        assert _wait_for(http, long["id"], {"cancelled"})["status"] == "cancelled"
        again = http.delete(f"/admin/v1/benchmarks/{long['id']}")
        assert again.status_code == 409
        unknown = http.post("/admin/v1/benchmarks", json={"backend": "nope"})
        assert unknown.status_code == 404


def _wait_for(http: httpx.Client, run_id: int, statuses: set[str]) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        run: dict[str, Any] = http.get(f"/admin/v1/benchmarks/{run_id}").json()
        if run["status"] in statuses:
            return run
        assert time.monotonic() < deadline, run
        time.sleep(0.1)
