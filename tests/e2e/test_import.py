"""`draftgate import vllm-bench`: a real result file's format into measurements, all or nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.e2e.conftest import CliRunner, draftgate_env, query_rows

FIXTURE = Path(__file__).parents[1] / "fixtures" / "vllm-bench-peagle-c8.json"


def test_vllm_bench_result_becomes_a_measurement(run_cli: CliRunner, tmp_path: Path) -> None:
    database_url = f"sqlite:///{tmp_path}/imports.db"
    env = draftgate_env(DRAFTGATE_DATABASE_URL=database_url)
    done = run_cli("import", "vllm-bench", str(FIXTURE), "--method", "p-eagle", "--k", "7",
                   "--gpu", "B200", env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    [row] = query_rows(database_url, "SELECT * FROM measurements")
    assert (row["model"], row["method"], row["k"], row["gpu_type"], row["source"]) == (
        "openai/gpt-oss-20b",
        "p-eagle",
        7,
        "B200",
        "import",
    )
    assert (row["concurrency"], row["output_tokens_per_s"]) == (8.0, 5189.4)
    assert (row["mean_acceptance_length"], row["ttft_ms"], row["itl_ms"]) == (3.84, 31.2, 5.61)
    assert json.loads(row["acceptance_per_position"])[:2] == [0.83, 0.69]
    table = run_cli("plan", "table", "--model", "openai/gpt-oss-20b", "--gpu", "B200", env=env)
    assert "1 measurements" in table.stdout  # the planner uses it


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"output_throughput": "fast"}, "'output_throughput' must be a number"),
        ({"output_throughput": None}, "missing 'output_throughput'"),
        ({"max_concurrency": None}, "give --concurrency"),
        ({"model_id": None}, "give --model"),
        ({"output_throughput": 500000.0}, "is above what 1x B200 can deliver"),
    ],
)
def test_a_bad_file_imports_nothing(
    run_cli: CliRunner, tmp_path: Path, change: dict[str, object], reason: str
) -> None:
    database_url = f"sqlite:///{tmp_path}/imports.db"
    env = draftgate_env(DRAFTGATE_DATABASE_URL=database_url)
    good = tmp_path / "good.json"
    shutil.copy(FIXTURE, good)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(json.loads(FIXTURE.read_text()) | change))
    done = run_cli("import", "vllm-bench", str(good), str(bad), "--method", "p-eagle",
                   "--k", "7", "--gpu", "B200", env=env)  # fmt: skip
    assert done.returncode == 2
    assert reason in done.stderr
    assert "nothing imported" in done.stderr
    assert run_cli("db", "upgrade", env=env).returncode == 0
    assert query_rows(database_url, "SELECT * FROM measurements") == []


GUIDELLM = Path(__file__).parents[1] / "fixtures" / "guidellm-report.json"


def test_guidellm_report_becomes_one_measurement_per_benchmark(
    run_cli: CliRunner, tmp_path: Path
) -> None:
    database_url = f"sqlite:///{tmp_path}/imports.db"
    env = draftgate_env(DRAFTGATE_DATABASE_URL=database_url)
    # 2.1 ms between tokens: faster than an H100 streams Qwen3-8B's 16 GB of weights (4.9 ms
    # at its datasheet bandwidth), within what a B200 can (2.0 ms)
    on_h100 = run_cli("import", "guidellm", str(GUIDELLM), "--model", "Qwen/Qwen3-8B",
                      "--method", "plain", "--gpu", "H100", env=env)  # fmt: skip
    assert on_h100.returncode == 2
    assert "is above what 1x H100 can deliver for Qwen/Qwen3-8B" in on_h100.stderr
    done = run_cli("import", "guidellm", str(GUIDELLM), "--model", "Qwen/Qwen3-8B",
                   "--method", "plain", "--gpu", "B200", env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = query_rows(database_url, "SELECT * FROM measurements ORDER BY concurrency")
    # Concurrency: the measured mean where reported, else the strategy's stream count.
    assert [(r["concurrency"], r["output_tokens_per_s"], r["ttft_ms"]) for r in rows] == [
        (3.9, 1830.5, 41.2),
        (16.0, 5210.0, 77.0),
    ]
    assert all(r["mean_acceptance_length"] is None for r in rows)  # GuideLLM has none

    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"benchmarks": [{"metrics": {}}]}))
    bad = run_cli("import", "guidellm", str(broken), "--model", "m", "--method", "plain",
                  "--gpu", "B200", env=env)  # fmt: skip
    assert bad.returncode == 2
    assert "benchmarks[0]" in bad.stderr
    assert len(query_rows(database_url, "SELECT id FROM measurements")) == 2
