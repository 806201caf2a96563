"""`draftgate bench` against a real simulator: client figures, acceptance from /metrics,
measurements stored, a vllm-bench JSON that imports back, open-loop rates and workloads."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from backends.bench import BenchConfig, arrival_schedule_s
from backends.sim.config import SimConfig, acceptance_profile
from backends.workloads import BenchWorkload, mean_lengths
from tests.e2e.conftest import (
    ADMIN_TOKEN,
    SIM_MODEL,
    CliRunner,
    ModuleGatewayStarter,
    ModuleServerStarter,
    Server,
    draftgate_env,
    fleet_backend,
    metric_value,
    query_rows,
    sim_args,
)

# Achieved rates on a shared machine: sending can only lag the schedule (late wake-ups, a
# busy event loop), never run ahead of it, so the bounds are loose below and tight above.
RATE_LOW, RATE_HIGH = 0.5, 1.05


# These simulators run 20 times as fast as the B200s they claim: their sweeps are stored
# only with the hardware's ceiling raised as much (2, the default, times 20 and more).
TIME_SCALED = {"DRAFTGATE_MEASUREMENT_CEILING_MARGIN": "200"}


@pytest.fixture(scope="module")
def sim(start_module_servers: ModuleServerStarter) -> Server:
    """One fast p-eagle simulator for the open-loop tests."""
    [server] = start_module_servers(sim_args("--method", "p-eagle", "--k", "7",
                                             "--time-scale", "20"))  # fmt: skip
    return server


def test_bench_sweep_stores_measurements_and_saves_vllm_bench_json(
    run_cli: CliRunner, start_module_servers: ModuleServerStarter, tmp_path: Path
) -> None:
    [sim] = start_module_servers(sim_args("--method", "p-eagle", "--k", "7", "--time-scale", "20"))
    database_url = f"sqlite:///{tmp_path}/bench.db"
    env = draftgate_env(DRAFTGATE_DATABASE_URL=database_url, **TIME_SCALED)
    saved = tmp_path / "result.json"
    done = run_cli("bench", "--url", sim.base_url, "--model", SIM_MODEL, "--concurrency", "1,4",
                   "--requests", "12", "--output-len", "48", "--save-result", str(saved),
                   "--method", "p-eagle", "--k", "7", "--gpu", "B200", env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = query_rows(database_url, "SELECT * FROM measurements ORDER BY concurrency")
    assert [(r["concurrency"], r["source"], r["method"]) for r in rows] == [
        (1.0, "bench", "p-eagle"),
        (4.0, "bench", "p-eagle"),
    ]
    assert rows[1]["output_tokens_per_s"] > rows[0]["output_tokens_per_s"] > 0
    profile = acceptance_profile(SimConfig(model=SIM_MODEL, method="p-eagle", k=7))
    assert profile is not None
    assert rows[0]["mean_acceptance_length"] == pytest.approx(
        profile.mean_acceptance_length(7), rel=0.2
    )

    result = json.loads((tmp_path / "result-c4.json").read_text())
    assert (result["max_concurrency"], result["completed"], result["failed"]) == (4, 12, 0)
    assert result["total_output_tokens"] == 12 * 48
    assert result["mean_ttft_ms"] > 0
    assert result["spec_decode_acceptance_length"] > 1
    # A streamed chunk carries a step's accepted tokens: the time between chunks (vLLM's ITL)
    # is several per-token latencies (its TPOT), the quantity latency objectives bound.
    assert result["mean_tpot_ms"] > 0
    assert result["mean_itl_ms"] > 1.5 * result["mean_tpot_ms"], (
        result["mean_itl_ms"],
        result["mean_tpot_ms"],
    )
    imported = run_cli("import", "vllm-bench", str(tmp_path / "result-c4.json"), "--method",
                       "p-eagle", "--k", "7", "--gpu", "B200", env=env)  # fmt: skip
    assert imported.returncode == 0, imported.stderr
    assert len(query_rows(database_url, "SELECT id FROM measurements")) == 3


def test_benchmarks_through_the_admin_api_run_in_the_background(
    start_module_servers: ModuleServerStarter, start_module_gateway: ModuleGatewayStarter
) -> None:
    [sim] = start_module_servers(sim_args("--method", "p-eagle", "--k", "7", "--time-scale", "20"))
    server, database_url = start_module_gateway(
        [fleet_backend("sim-peagle", sim.base_url, "p-eagle")]
    )
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    with httpx.Client(base_url=server.base_url, headers=admin, timeout=10) as http:
        body = {
            "backend": "sim-peagle",
            "concurrency": [1, 2],
            "requests_per_level": 6,
            "output_len": 32,
        }
        started = http.post("/admin/v1/benchmarks", json=body)
        assert started.status_code == 202, started.text
        run = _wait_for(http, started.json()["id"], {"succeeded", "failed"})
        assert run["status"] == "succeeded", run
        assert run["progress"] == 1.0
        assert [lvl["concurrency"] for lvl in run["result"]["levels"]] == [1, 2]
        assert all(lvl["completed"] == 6 for lvl in run["result"]["levels"])
        rows = query_rows(database_url, "SELECT * FROM measurements WHERE source = 'bench'")
        assert sorted((r["concurrency"], r["method"], r["backend_name"]) for r in rows) == [
            (1.0, "p-eagle", "sim-peagle"),
            (2.0, "p-eagle", "sim-peagle"),
        ]

        long = http.post(
            "/admin/v1/benchmarks", json={"backend": "sim-peagle", "duration_s": 60}
        ).json()
        _wait_for(http, long["id"], {"running"})
        _cancel_and_wait_until_stopped(http, long["id"], sim)
        again = http.delete(f"/admin/v1/benchmarks/{long['id']}")
        assert again.status_code == 409
        unknown = http.post("/admin/v1/benchmarks", json={"backend": "nope"})
        assert unknown.status_code == 404


def _cancel_and_wait_until_stopped(http: httpx.Client, run_id: int, sim: Server) -> None:
    """Cancel a running sweep; the leader stops it and records its levels, the backend
    goes idle."""
    cancelled = http.delete(f"/admin/v1/benchmarks/{run_id}")
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["status"] == "cancelled"
    deadline = time.monotonic() + 30
    while http.get(f"/admin/v1/benchmarks/{run_id}").json()["result"] is None:
        assert time.monotonic() < deadline, "the leader did not stop the sweep"
        time.sleep(0.1)
    while metric_value(sim.base_url, "vllm:num_requests_running"):
        assert time.monotonic() < deadline, "the backend still serves the cancelled sweep"
        time.sleep(0.1)
    assert http.get(f"/admin/v1/benchmarks/{run_id}").json()["status"] == "cancelled"


def _wait_for(http: httpx.Client, run_id: int, statuses: set[str]) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        run: dict[str, Any] = http.get(f"/admin/v1/benchmarks/{run_id}").json()
        if run["status"] in statuses:
            return run
        assert time.monotonic() < deadline, run
        time.sleep(0.1)


def test_open_loop_poisson_bench_reaches_the_requested_rate(
    run_cli: CliRunner, sim: Server, tmp_path: Path
) -> None:
    saved = tmp_path / "poisson.json"
    done = run_cli("bench", "--url", sim.base_url, "--model", SIM_MODEL, "--concurrency", "8",
                   "--rate", "20", "--poisson", "--seed", "7", "--requests", "40",
                   "--workload", "chat", "--output-len", "24", "--save-result", str(saved),
                   env=draftgate_env())  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(saved.read_text())
    assert (result["request_rate"], result["burstiness"], result["max_concurrency"]) == (
        20.0,
        1.0,
        8,
    )
    assert (result["completed"], result["failed"]) == (40, 0)
    assert RATE_LOW * 20 <= result["achieved_request_rate"] <= RATE_HIGH * 20
    assert result["duration"] >= 40 / 20  # the last arrival is due at count / rate
    workload = BenchWorkload("chat", mean_lengths("chat")[0], 24, seed=7)
    planned = [workload.request(i).max_tokens for i in range(40)]
    assert result["total_output_tokens"] == sum(planned)
    assert len(set(planned)) > 5  # chat lengths vary around the mean
    header, row = done.stdout.splitlines()[:2]
    assert "req/s" in header
    assert 20 * RATE_LOW <= float(row.split()[3]) <= 20 * RATE_HIGH


def test_open_loop_even_arrivals_for_a_duration_are_stored_at_their_real_concurrency(
    run_cli: CliRunner, sim: Server, tmp_path: Path
) -> None:
    database_url = f"sqlite:///{tmp_path}/bench.db"
    saved = tmp_path / "even.json"
    done = run_cli("bench", "--url", sim.base_url, "--model", SIM_MODEL, "--concurrency", "4",
                   "--rate", "10", "--duration", "1.05", "--workload", "code", "--output-len",
                   "16", "--save-result", str(saved), "--method", "p-eagle", "--k", "7",
                   "--gpu", "B200",
                   env=draftgate_env(DRAFTGATE_DATABASE_URL=database_url, **TIME_SCALED),
                   )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(saved.read_text())
    due = list(
        arrival_schedule_s(
            BenchConfig(sim.base_url, SIM_MODEL, (4,), duration_s=1.05, rate_per_s=10.0)
        )
    )
    assert len(due) == 10  # one every 0.1 s until 1.05 s
    assert (result["request_rate"], result["burstiness"]) == (10.0, "inf")
    assert (result["completed"], result["failed"]) == (10, 0)
    assert RATE_LOW * 10 <= result["achieved_request_rate"] <= RATE_HIGH * 10
    [row] = query_rows(database_url, "SELECT * FROM measurements")
    assert 0 < row["concurrency"] <= 4  # requests in flight on average, at most the cap
    assert row["concurrency"] == pytest.approx(
        result["mean_e2el_ms"] / 1000 * 10 / result["duration"], rel=0.05
    )  # Little's law: Σ latency / duration
    assert row["output_tokens_per_s"] == pytest.approx(result["output_throughput"])


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (("--poisson",), "give --rate too"),
        (("--rate", "5", "--burstiness", "0.5"), "give --poisson too"),
        (("--workload", "poetry"), "unknown --workload 'poetry'; known: synthetic, code"),
    ],
)
def test_bench_refuses_arrival_and_workload_options_that_make_no_sense(
    run_cli: CliRunner, options: tuple[str, ...], message: str
) -> None:
    done = run_cli("bench", "--url", "http://127.0.0.1:9", "--model", SIM_MODEL, *options,
                   env=draftgate_env())  # fmt: skip
    assert done.returncode == 2
    assert message in done.stderr


def test_admin_api_runs_a_rate_limited_workload_benchmark(
    sim: Server, start_module_gateway: ModuleGatewayStarter
) -> None:
    server, database_url = start_module_gateway(
        [fleet_backend("sim-rate", sim.base_url, "p-eagle")]
    )
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    with httpx.Client(base_url=server.base_url, headers=admin, timeout=10) as http:
        body = {
            "backend": "sim-rate",
            "concurrency": [4],
            "requests_per_level": 20,
            "rate_per_s": 25,
            "poisson": True,
            "seed": 3,
            "workload": "math",
            "output_len": 24,
        }
        started = http.post("/admin/v1/benchmarks", json=body)
        assert started.status_code == 202, started.text
        params = started.json()["params"]
        assert {k: params[k] for k in body} == body
        assert (params["burstiness"], params["input_len"]) == (1.0, mean_lengths("math")[0])
        run = _wait_for(http, started.json()["id"], {"succeeded", "failed"})
        assert run["status"] == "succeeded", run
        assert run["params"] == params
        [level] = run["result"]["levels"]
        assert (level["concurrency"], level["completed"], level["failed"]) == (4, 20, 0)
        assert level["request_rate_per_s"] == 25
        assert RATE_LOW * 25 <= level["achieved_request_rate_per_s"] <= RATE_HIGH * 25
        assert level["duration_s"] >= 20 / 25
        rows = query_rows(database_url, "SELECT * FROM measurements WHERE source = 'bench'")
        assert [r["backend_name"] for r in rows] == ["sim-rate"]
        assert rows[0]["concurrency"] == pytest.approx(level["mean_in_flight"])
        assert 0 < rows[0]["concurrency"] <= 4

        refused = http.post("/admin/v1/benchmarks", json={"backend": "sim-rate", "poisson": True})
        assert refused.status_code == 422
        assert refused.json()["error"]["param"] == "poisson"

        open_ended = {"backend": "sim-rate", "concurrency": [2], "duration_s": 60, "rate_per_s": 5}
        long = http.post("/admin/v1/benchmarks", json=open_ended).json()
        _wait_for(http, long["id"], {"running"})
        _cancel_and_wait_until_stopped(http, long["id"], sim)
