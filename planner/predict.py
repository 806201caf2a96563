"""The prediction contract: a scenario in, predicted throughput, speedup, ITL and cost out.

`draftgate plan predict --input scenario.json` reads a scenario (model, GPU, method, K,
acceptance, optional measurements, concurrencies) and prints predictions. Measurements fit
the model's free host-overhead parameters: a plain-decoding point sets the target's step
overhead, a point of the method sets the drafter's pass overhead; everything else is the
roofline of the catalogued GPU and model. Acceptance is an input: it does not depend on the
hardware.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from planner import calibration, catalog
from planner.calibration import EngineCalibration, Workload
from planner.catalog import ModelSpec, UnknownCatalogEntry
from planner.cost import usd_per_mtok
from planner.specdec import StepTimeModel, mean_step_s, output_tokens_per_s

DEFAULT_WORKLOAD = Workload("contract", prompt_tokens=256, output_tokens=512, source="default")
METHODS_WITHOUT_DRAFTER_MODEL = ("ngram", "suffix")


class PlanError(ValueError):
    """A scenario the planner cannot predict; the message names the value."""


@dataclass(frozen=True)
class Measurement:
    """A measured throughput point."""

    method: str
    k: int
    concurrency: float
    output_tokens_per_s: float


@dataclass(frozen=True)
class Scenario:
    """What to predict."""

    model: ModelSpec
    gpu: catalog.GpuSpec
    gpu_count: int
    method: str
    k: int
    acceptance_length: float
    measurements: tuple[Measurement, ...]
    concurrency: tuple[int, ...]
    price_usd_per_gpu_hour: float
    workload: Workload = DEFAULT_WORKLOAD


@dataclass(frozen=True)
class Prediction:
    """One concurrency's prediction."""

    concurrency: int
    plain_output_tokens_per_s: float
    method_output_tokens_per_s: float
    speedup: float
    itl_ms: float
    usd_per_mtok: float
    source: str  # "measured" when the method was measured at this concurrency, else "estimated"


def parse_scenario(raw: Mapping[str, Any]) -> Scenario:
    """Validate a scenario document, naming any bad value."""
    model = _model(raw.get("model"))
    gpu = _lookup(catalog.gpu, raw.get("gpu"), "gpu")
    method = raw.get("method", "plain")
    if not isinstance(method, str):
        raise PlanError(f"method must be a string, got {method!r}")
    k = _k(method, raw.get("k"))
    gpu_count = _positive_int(raw.get("gpu_count", 1), "gpu_count")
    price = raw.get("price_usd_per_gpu_hour")
    if price is None:
        price = catalog.default_price(gpu.name).usd_per_gpu_hour
    return Scenario(
        model=model,
        gpu=gpu,
        gpu_count=gpu_count,
        method=method,
        k=k,
        acceptance_length=_acceptance(raw, method, k),
        measurements=tuple(_measurement(m) for m in raw.get("measurements") or ()),
        concurrency=tuple(_positive_int(c, "concurrency") for c in raw.get("concurrency") or (1,)),
        price_usd_per_gpu_hour=float(price),
    )


def _lookup(find: Callable[[str], Any], name: object, what: str) -> Any:
    if not isinstance(name, str):
        raise PlanError(f"{what} must be a name, got {name!r}")
    try:
        return find(name)
    except UnknownCatalogEntry as exc:
        raise PlanError(str(exc)) from None


def _model(value: object) -> ModelSpec:
    if not isinstance(value, Mapping):
        return _lookup(catalog.model, value, "model")  # type: ignore[no-any-return]
    try:
        params, active = (
            float(value["params_b"]),
            float(value.get("active_params_b", value["params_b"])),
        )
        hidden, head_dim = int(value["hidden"]), int(value["head_dim"])
        dtype_bytes = float(value.get("dtype_bytes", 2))
        return ModelSpec(
            name=str(value.get("name", "inline")),
            aliases=(),
            params_b=params,
            active_params_b=active,
            layers=int(value["layers"]),
            hidden_size=hidden,
            num_attention_heads=int(value.get("heads", hidden // head_dim)),
            num_kv_heads=int(value["kv_heads"]),
            head_dim=head_dim,
            vocab_size=int(value.get("vocab_size", 128_000)),
            weight_dtype="bf16",
            weight_bytes_per_param=dtype_bytes,
            kv_bytes_per_element=dtype_bytes,
            sliding_window=None,
            sliding_window_layer_fraction=0.0,
            max_context=int(value.get("max_context", 32_768)),
            source="inline",
            estimated=True,
        )
    except (KeyError, TypeError, ValueError) as exc:
        needed = "params_b, layers, hidden, kv_heads, head_dim"
        raise PlanError(f"inline model needs numeric {needed}; bad or missing: {exc}") from None


def _positive_int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise PlanError(f"{name} must be a positive number, got {value!r}")
    return int(value)


def _k(method: str, value: object) -> int:
    if method == "plain":
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise PlanError(f"k must be a positive integer for method {method!r}, got {value!r}")
    return value


def _acceptance(raw: Mapping[str, Any], method: str, k: int) -> float:
    if method == "plain":
        return 1.0
    per_position = raw.get("per_position_acceptance")
    if per_position is not None:
        if not isinstance(per_position, list) or not all(
            isinstance(p, int | float) and 0 <= p <= 1 for p in per_position
        ):
            raise PlanError(f"per_position_acceptance must be fractions, got {per_position!r}")
        length = 1.0 + sum(per_position[:k])
    else:
        given = raw.get("acceptance_length")
        if isinstance(given, bool) or not isinstance(given, int | float):
            raise PlanError(f"acceptance_length must be a number, got {given!r}")
        length = float(given)
    if not 1.0 <= length <= k + 1:
        raise PlanError(f"acceptance_length must be in [1, K+1] = [1, {k + 1}], got {length}")
    return float(length)


def _measurement(raw: object) -> Measurement:
    if not isinstance(raw, Mapping):
        raise PlanError(f"a measurement must be an object, got {raw!r}")
    try:
        return Measurement(
            method=str(raw["method"]),
            k=int(raw.get("k") or 0),
            concurrency=float(raw["concurrency"]),
            output_tokens_per_s=float(raw["output_tokens_per_s"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise PlanError(f"measurement {dict(raw)!r} lacks a numeric {exc}") from None


def step_model(s: Scenario, cal: EngineCalibration, method: str, k: int) -> StepTimeModel:
    """The step-time model of `method` with K drafts for this scenario's hardware."""
    drafter = (
        None if method in METHODS_WITHOUT_DRAFTER_MODEL else calibration.drafters().get(method)
    )
    return StepTimeModel(s.model, s.gpu, s.gpu_count, cal, drafter if k else None, k)


def _solve(fn: Callable[[float], float], target: float, lo: float, hi: float) -> float:
    """The x in [lo, hi] where the decreasing `fn(x)` crosses `target` (bisection)."""
    if fn(lo) < target:
        return lo
    if fn(hi) > target:
        return hi
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if fn(mid) > target else (lo, mid)
    return (lo + hi) / 2


def fit(s: Scenario, base: EngineCalibration) -> EngineCalibration:
    """Fit the host overheads to the scenario's lowest-concurrency measurements."""
    cal = base
    plain = sorted((m for m in s.measurements if m.method == "plain"), key=lambda m: m.concurrency)
    if plain:
        m = plain[0]

        def plain_tps(overhead: float) -> float:
            model = step_model(s, replace(cal, step_overhead_s=overhead), "plain", 0)
            return output_tokens_per_s(model, round(m.concurrency), 1.0, s.workload)

        cal = replace(cal, step_overhead_s=_solve(plain_tps, m.output_tokens_per_s, 0.0, 0.2))
    mine = [x for x in s.measurements if x.method == s.method and x.k == s.k and s.k]
    if mine:
        m = min(mine, key=lambda x: x.concurrency)

        def method_tps(overhead: float) -> float:
            model = step_model(s, replace(cal, drafter_pass_overhead_s=overhead), s.method, s.k)
            return output_tokens_per_s(model, round(m.concurrency), s.acceptance_length, s.workload)

        overhead = _solve(method_tps, m.output_tokens_per_s, 0.0, 0.2)
        cal = replace(cal, drafter_pass_overhead_s=overhead)
    return cal


def predict(s: Scenario, base: EngineCalibration | None = None) -> list[Prediction]:
    """Predictions at each of the scenario's concurrencies."""
    cal = fit(s, base or calibration.engine_calibration())
    plain_model, model = step_model(s, cal, "plain", 0), step_model(s, cal, s.method, s.k)
    measured = {
        m.concurrency: m.output_tokens_per_s
        for m in s.measurements
        if m.method == s.method and m.k == s.k
    }
    out = []
    for c in s.concurrency:
        plain = output_tokens_per_s(plain_model, c, 1.0, s.workload)
        tps = output_tokens_per_s(model, c, s.acceptance_length, s.workload)
        source = "measured" if c in measured else "estimated"
        tps = measured.get(c, tps)
        itl_s = mean_step_s(model, c, s.acceptance_length, s.workload) / s.acceptance_length
        out.append(
            Prediction(
                concurrency=c,
                plain_output_tokens_per_s=plain,
                method_output_tokens_per_s=tps,
                speedup=tps / plain,
                itl_ms=itl_s * 1000,
                usd_per_mtok=usd_per_mtok(s.price_usd_per_gpu_hour, s.gpu_count, tps),
                source=source,
            )
        )
    return out


def predictions_json(predictions: Sequence[Prediction]) -> dict[str, Any]:
    """The contract's output document."""
    return {"predictions": [p.__dict__ for p in predictions]}
