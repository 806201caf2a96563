"""Importers: benchmark result files from other tools into measurements (pure parsing).

`vllm bench serve --save-result` JSON (vllm/benchmarks/serve.py) carries throughput,
latency means and, when the server speculates, the acceptance it scraped from `/metrics`.
What the file does not say (method, K, GPU) comes from the caller.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class ImportRejected(ValueError):
    """A file that cannot be imported; the message names the file and the reason."""


@dataclass(frozen=True)
class ImportedPoint:
    """One measurement read from a file."""

    model: str
    concurrency: float
    output_tokens_per_s: float
    mean_acceptance_length: float | None
    acceptance_per_position: list[float] | None
    ttft_ms: float | None
    itl_ms: float | None
    requests: int | None = None  # the sample: requests completed, and their mean lengths
    mean_prompt_tokens: float | None = None
    mean_output_tokens: float | None = None


def _number(data: dict[str, Any], key: str, where: str, *, required: bool) -> float | None:
    value = data.get(key)
    if value is None:
        if required:
            raise ImportRejected(f"{where}: missing {key!r}")
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ImportRejected(f"{where}: {key!r} must be a number, got {value!r}")
    return float(value)


def read_vllm_bench(path: Path, *, model: str | None, concurrency: float | None) -> ImportedPoint:
    """One `vllm bench serve` result file as a measurement."""
    where = str(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ImportRejected(f"{where}: not a readable JSON file ({exc})") from None
    if not isinstance(data, dict):
        raise ImportRejected(f"{where}: expected a JSON object")
    name = model or data.get("model_id")
    if not isinstance(name, str) or not name:
        raise ImportRejected(f"{where}: no model_id; give --model")
    c = concurrency or _observed_concurrency(data, where)
    if c is None or c <= 0:
        raise ImportRejected(f"{where}: cannot tell the run's concurrency; give --concurrency")
    tps = _number(data, "output_throughput", where, required=True)
    assert tps is not None
    if tps <= 0:
        raise ImportRejected(f"{where}: output_throughput must be > 0, got {tps}")
    per_position = data.get("spec_decode_per_position_acceptance_rates")
    if per_position is not None and not (
        isinstance(per_position, list) and all(isinstance(p, int | float) for p in per_position)
    ):
        raise ImportRejected(f"{where}: spec_decode_per_position_acceptance_rates must be numbers")
    return ImportedPoint(
        model=name,
        concurrency=c,
        output_tokens_per_s=tps,
        mean_acceptance_length=_number(
            data, "spec_decode_acceptance_length", where, required=False
        ),
        acceptance_per_position=[float(p) for p in per_position] if per_position else None,
        ttft_ms=_number(data, "mean_ttft_ms", where, required=False),
        itl_ms=_number(data, "mean_itl_ms", where, required=False),
        **_bench_sample(data, where),
    )


def _bench_sample(data: dict[str, Any], where: str) -> dict[str, Any]:
    """Requests completed and their mean lengths, from a `vllm bench serve` file's totals."""
    completed = _number(data, "completed", where, required=False)
    if not completed or completed < 1:
        return {}
    inputs = _number(data, "total_input_tokens", where, required=False)
    outputs = _number(data, "total_output_tokens", where, required=False)
    return {
        "requests": int(completed),
        "mean_prompt_tokens": None if inputs is None else inputs / completed,
        "mean_output_tokens": None if outputs is None else outputs / completed,
    }


def _observed_concurrency(data: dict[str, Any], where: str) -> float | None:
    """Requests in flight during the run.

    Closed loop (`request_rate` inf), that is `max_concurrency`. At a finite rate the cap
    only bounds it: the mean in flight is, by Little's law, request throughput times mean
    end-to-end latency (`mean_e2el_ms`, or TTFT plus TPOT per further output token when the
    run did not report end-to-end percentiles).
    """
    cap = _number(data, "max_concurrency", where, required=False)
    rate = data.get("request_rate", "inf")
    if rate == "inf" or (isinstance(rate, int | float) and math.isinf(rate)):
        return cap
    throughput = _number(data, "request_throughput", where, required=False)
    latency_ms = _number(data, "mean_e2el_ms", where, required=False)
    if latency_ms is None:
        ttft = _number(data, "mean_ttft_ms", where, required=False)
        tpot = _number(data, "mean_tpot_ms", where, required=False)
        outputs = _number(data, "total_output_tokens", where, required=False)
        completed = _number(data, "completed", where, required=False)
        if ttft is None or tpot is None or outputs is None or not completed:
            return None
        latency_ms = ttft + tpot * max(outputs / completed - 1, 0.0)
    if throughput is None:
        return None
    in_flight = throughput * latency_ms / 1000
    return min(in_flight, cap) if cap else in_flight


def _mean(metrics: dict[str, Any], name: str) -> float | None:
    """`metrics[name].successful.mean` of a GuideLLM benchmark, if present and numeric."""
    summary = metrics.get(name)
    successful = summary.get("successful") if isinstance(summary, dict) else None
    value = successful.get("mean") if isinstance(successful, dict) else None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def read_guidellm(path: Path, *, model: str) -> list[ImportedPoint]:
    """A GuideLLM report (`--output kind=json`): one measurement per benchmark in it.

    GuideLLM does not report speculative acceptance; concurrency is the measured mean
    request concurrency, else the strategy's stream count.
    """
    where = str(path)
    try:
        report = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ImportRejected(f"{where}: not a readable JSON file ({exc})") from None
    benchmarks = report.get("benchmarks") if isinstance(report, dict) else None
    if not isinstance(benchmarks, list) or not benchmarks:
        raise ImportRejected(f"{where}: no 'benchmarks' list (not a GuideLLM report)")
    return [
        _guidellm_point(b, f"{where}: benchmarks[{i}]", model) for i, b in enumerate(benchmarks)
    ]


def _guidellm_point(benchmark: object, where: str, model: str) -> ImportedPoint:
    if not isinstance(benchmark, dict):
        raise ImportRejected(f"{where}: not an object")
    metrics = benchmark.get("metrics")
    if not isinstance(metrics, dict):
        raise ImportRejected(f"{where}: no 'metrics'")
    tps = _mean(metrics, "output_tokens_per_second")
    if tps is None or tps <= 0:
        raise ImportRejected(
            f"{where}: no positive metrics.output_tokens_per_second.successful.mean"
        )
    concurrency = _mean(metrics, "request_concurrency")
    if concurrency is None:
        config = benchmark.get("config")
        strategy = config.get("strategy") if isinstance(config, dict) else None
        streams = strategy.get("streams") if isinstance(strategy, dict) else None
        concurrency = float(streams) if isinstance(streams, int | float) else None
    if concurrency is None or concurrency <= 0:
        raise ImportRejected(f"{where}: no request concurrency or strategy streams")
    return ImportedPoint(
        model=model,
        concurrency=concurrency,
        output_tokens_per_s=tps,
        mean_acceptance_length=None,
        acceptance_per_position=None,
        ttft_ms=_mean(metrics, "time_to_first_token_ms"),
        itl_ms=_mean(metrics, "inter_token_latency_ms"),
        requests=_count(metrics, "output_token_count"),
        mean_prompt_tokens=_mean(metrics, "prompt_token_count"),
        mean_output_tokens=_mean(metrics, "output_token_count"),
    )


def _count(metrics: dict[str, Any], name: str) -> int | None:
    """`metrics[name].successful.count` of a GuideLLM benchmark: the requests behind it."""
    summary = metrics.get(name)
    successful = summary.get("successful") if isinstance(summary, dict) else None
    value = successful.get("count") if isinstance(successful, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
