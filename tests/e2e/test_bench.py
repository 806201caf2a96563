"""`draftgate bench` against a real simulator: client figures, acceptance from /metrics,
measurements stored, and a vllm-bench JSON that imports back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from backends.sim.config import SimConfig, acceptance_profile
from tests.e2e.conftest import (
    SIM_MODEL,
    CliRunner,
    ModuleServerStarter,
    draftgate_env,
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
