"""`vllm bench serve` files: the concurrency a measurement is stored at."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from backends.importers import ImportRejected, read_vllm_bench

BASE: dict[str, Any] = {
    "model_id": "m",
    "output_throughput": 900.0,
    "completed": 100,
    "total_output_tokens": 12800,
    "request_throughput": 4.0,
}


def _read(tmp_path: Path, **fields: Any) -> float:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(BASE | fields))
    return read_vllm_bench(path, model=None, concurrency=None).concurrency


def test_a_closed_loop_run_is_stored_at_its_concurrency_cap(tmp_path: Path) -> None:
    assert _read(tmp_path, request_rate="inf", max_concurrency=16) == 16


def test_a_rate_run_is_stored_at_its_mean_in_flight_by_littles_law(tmp_path: Path) -> None:
    # 4 requests/s, each 2.5 s end to end: 10 in flight on average, though the cap was 64.
    assert _read(tmp_path, request_rate=4.0, max_concurrency=64, mean_e2el_ms=2500.0) == 10.0


def test_without_end_to_end_percentiles_latency_is_ttft_plus_tpot(tmp_path: Path) -> None:
    # 128 output tokens per request: 100 ms + 127 * 10 ms = 1.37 s; 4/s -> 5.48 in flight.
    c = _read(tmp_path, request_rate=4.0, mean_ttft_ms=100.0, mean_tpot_ms=10.0)
    assert c == pytest.approx(5.48)


def test_little_never_exceeds_the_cap(tmp_path: Path) -> None:
    assert _read(tmp_path, request_rate=4.0, max_concurrency=8, mean_e2el_ms=5000.0) == 8


def test_a_rate_run_without_latencies_needs_the_concurrency_given(tmp_path: Path) -> None:
    with pytest.raises(ImportRejected, match="give --concurrency"):
        _read(tmp_path, request_rate=4.0, max_concurrency=64)


def test_a_run_says_how_many_requests_it_rests_on_and_their_lengths(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(BASE | {"max_concurrency": 8, "total_input_tokens": 3000}))
    point = read_vllm_bench(path, model=None, concurrency=None)
    assert (point.requests, point.mean_prompt_tokens, point.mean_output_tokens) == (100, 30, 128)
    path.write_text(json.dumps(BASE | {"max_concurrency": 8, "completed": 0}))
    point = read_vllm_bench(path, model=None, concurrency=None)
    assert (point.requests, point.mean_output_tokens) == (None, None)  # nothing to weigh by
