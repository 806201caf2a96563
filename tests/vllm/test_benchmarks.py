"""Benchmarks against real vLLM: draftgate's runner reads acceptance from the server's own
counters, and vLLM's `vllm bench serve` through the gateway saves JSON that imports."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from backends.bench import BenchConfig, run_sweep
from backends.launcher import vllm_env
from backends.vllm_metrics import difference, parse_metrics
from tests.e2e.conftest import (
    LEDGER_TIMEOUT_S,
    CliRunner,
    ModuleGatewayStarter,
    Server,
    draftgate_env,
    query_rows,
    run_cli,
)
from tests.vllm.conftest import K, RealServer, fleet_entry

__all__ = ["run_cli"]  # the e2e CLI fixture
pytestmark = pytest.mark.vllm

BENCH_TIMEOUT_S = 300.0


def _snapshot(server: RealServer) -> str:
    return httpx.get(f"{server.url}/metrics", timeout=10).text


def test_the_runner_measures_a_real_server(vllm_servers: dict[str, RealServer]) -> None:
    server = vllm_servers["self-draft"]
    # Greedy: at the server's default temperature (1.0) the tiny random target's flat
    # distribution gives its own argmax draft a probability near 1/vocab, so a sweep can
    # accept nothing; at 0 the target drafting for itself is accepted by construction.
    config = BenchConfig(
        url=server.url,
        model=server.model,
        concurrency=(2,),
        requests_per_level=6,
        input_len=16,
        output_len=32,
        temperature=0.0,
    )
    before = parse_metrics(_snapshot(server))
    [level] = asyncio.run(run_sweep(config, lambda line: None))
    after = parse_metrics(_snapshot(server))
    assert (level.completed, level.failed) == (6, 0)
    assert level.output_tokens == 6 * 32
    assert len(level.ttft_ms) == 6
    assert all(t > 0 for t in level.ttft_ms)
    change = difference(before, after, 1.0)
    assert change is not None
    assert change.output_tokens == 6 * 32
    # The sweep was the only traffic: its acceptance is the counters' own.
    assert level.acceptance_length == pytest.approx(1 + change.accepted / change.drafts)
    assert level.acceptance_length > 1  # the target drafting for itself
    assert level.acceptance_per_position is not None
    assert len(level.acceptance_per_position) == K["draft_model"]


@pytest.fixture(scope="module")
def gateway(
    vllm_servers: dict[str, RealServer], start_module_gateway: ModuleGatewayStarter
) -> tuple[Server, str]:
    return start_module_gateway([fleet_entry(s) for s in vllm_servers.values()])


def _vllm_bench(vllm_python: Path, base_url: str, model: str, tokenizer: Path, out: Path) -> None:
    argv = [str(vllm_python.parent / "vllm"), "bench", "serve", "--backend", "openai",
            "--base-url", base_url, "--model", model, "--tokenizer", str(tokenizer),
            "--dataset-name", "random", "--random-input-len", "32", "--random-output-len", "32",
            "--num-prompts", "8", "--max-concurrency", "2", "--ignore-eos", "--temperature", "0",
            "--save-result", "--result-dir", str(out.parent),
            "--result-filename", out.name]  # fmt: skip
    env = draftgate_env(**vllm_env(vllm_python))
    done = subprocess.run(
        argv, env=env, capture_output=True, text=True, timeout=BENCH_TIMEOUT_S, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def _usage(database_url: str, model: str, at_least: int) -> list[dict[str, object]]:
    """The model's usage records, once the ledger holds `at_least` of them."""
    deadline = time.monotonic() + LEDGER_TIMEOUT_S
    while True:
        rows = query_rows(database_url, "SELECT * FROM usage_records WHERE model = :m", m=model)
        if len(rows) >= at_least or time.monotonic() > deadline:
            assert len(rows) >= at_least, rows
            return rows
        time.sleep(0.1)


def test_vllm_bench_serve_through_the_gateway_imports_as_a_measurement(
    vllm_python: Path,
    vllm_servers: dict[str, RealServer],
    gateway: tuple[Server, str],
    run_cli: CliRunner,
    tmp_path: Path,
) -> None:
    server, database_url = gateway
    ngram = vllm_servers["ngram"]
    target = Path(ngram.server.argv[2])
    saved = tmp_path / "bench-ngram.json"
    _vllm_bench(vllm_python, server.base_url, ngram.model, target, saved)
    result = json.loads(saved.read_text())
    assert (result["completed"], result["failed"], result["max_concurrency"]) == (8, 0, 2)
    assert result["total_output_tokens"] == 8 * 32
    assert result["output_throughput"] > 0
    # Every request went through the gateway to the n-gram server (vLLM adds a test request).
    served = _usage(database_url, ngram.model, at_least=8)
    assert {(r["method"], r["completion_tokens"], r["status_code"]) for r in served} == {
        ("ngram", 32, 200)
    }

    store = f"sqlite:///{tmp_path}/measurements.db"
    imported = run_cli("import", "vllm-bench", str(saved), "--method", "ngram", "--k", "4",
                       "--gpu", "cpu", env=draftgate_env(DRAFTGATE_DATABASE_URL=store))  # fmt: skip
    assert imported.returncode == 0, imported.stderr
    [row] = query_rows(store, "SELECT * FROM measurements")
    assert (row["model"], row["method"], row["k"], row["source"]) == (
        ngram.model,
        "ngram",
        4,
        "import",
    )
    assert row["concurrency"] == 2
    assert row["output_tokens_per_s"] == pytest.approx(result["output_throughput"])
    assert row["ttft_ms"] == pytest.approx(result["mean_ttft_ms"])
