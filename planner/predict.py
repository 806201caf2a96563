"""The prediction contract: a scenario in, predicted throughput, speedup, ITL and cost out.

`draftgate plan predict --input scenario.json` reads a scenario (model, GPU, method, K,
acceptance, optional measurements, concurrencies) and prints predictions. Measurements fit
the model's free parameters (host overheads, achieved bandwidth and compute efficiency,
each within bounds); everything else is the roofline of the catalogued GPU and model. A
measured concurrency is predicted as its measurement; the others are the fitted model
anchored to the nearest measurement, and the output shows how far the model itself is from
each measurement. Acceptance is an input: it does not depend on the hardware.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from planner import calibration, catalog
from planner.calibration import EngineCalibration, Workload
from planner.catalog import ModelSpec, UnknownCatalogEntry
from planner.cost import usd_per_mtok
from planner.fit_measurements import (
    FREE,
    Hardware,
    MeasuredPoint,
    fit_calibration,
    predict_point,
)
from planner.memory import max_concurrency
from planner.specdec import StepTimeModel, output_tokens_per_s

DEFAULT_WORKLOAD = Workload("contract", prompt_tokens=256, output_tokens=512, source="default")
# An inline MoE model without expert counts routes each token to 8 of 128 experts, as
# Qwen3-30B-A3B, Qwen3-235B-A22B and Qwen3-Coder do (DeepSeek-V3 8 of 256, gpt-oss 4 of
# 32 or 128): the routed experts hold what is not active, scaled up by 1 / (1 - 8/128).
DEFAULT_EXPERTS, DEFAULT_EXPERTS_PER_TOKEN = 128, 8
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
    engine: str = calibration.DEFAULT_ENGINE


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
    workload = DEFAULT_WORKLOAD
    if "prompt_tokens" in raw or "output_tokens" in raw:
        workload = Workload(
            "scenario",
            _positive_int(
                raw.get("prompt_tokens", DEFAULT_WORKLOAD.prompt_tokens), "prompt_tokens"
            ),
            _positive_int(
                raw.get("output_tokens", DEFAULT_WORKLOAD.output_tokens), "output_tokens"
            ),
            "scenario",
        )
    engine = raw.get("engine", calibration.DEFAULT_ENGINE)
    if engine not in calibration.engines():
        raise PlanError(f"engine must be one of {', '.join(calibration.engines())}, got {engine!r}")
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
        workload=workload,
        engine=engine,
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
        if not 0 < active <= params:
            raise PlanError(f"active_params_b must be in (0, params_b], got {active}")
        experts = _experts(value, params, active)
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
            **experts,
        )
    except PlanError:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        needed = "params_b, layers, hidden, kv_heads, head_dim"
        raise PlanError(f"inline model needs numeric {needed}; bad or missing: {exc}") from None


def _experts(value: Mapping[str, Any], params: float, active: float) -> dict[str, Any]:
    """An inline MoE's routed experts: as given, else the default routing. Of the
    parameters, E are routed experts and the rest dense, with active = dense + E * top/N."""
    if active == params:
        return {}
    n = int(value.get("num_experts", DEFAULT_EXPERTS))
    top = int(value.get("experts_per_token", DEFAULT_EXPERTS_PER_TOKEN))
    if not 0 < top < n:
        raise PlanError(f"experts_per_token must be in (0, num_experts), got {top} of {n}")
    routed = value.get("expert_params_b")
    routed = (params - active) / (1 - top / n) if routed is None else float(routed)
    if not params - active <= routed <= params:
        raise PlanError(
            f"expert_params_b must be in [params_b - active_params_b, params_b], got {routed}"
        )
    return {"num_experts": n, "experts_per_token": top, "expert_params_b": routed}


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


@dataclass(frozen=True)
class Residual:
    """A measurement beside the fitted model's value for it, before the measurement is
    substituted: where the model cannot reach a measurement within its bounds, this says
    by how much."""

    method: str
    k: int
    concurrency: float
    measured_output_tokens_per_s: float
    modelled_output_tokens_per_s: float

    @property
    def relative(self) -> float:
        """modelled / measured - 1."""
        return self.modelled_output_tokens_per_s / self.measured_output_tokens_per_s - 1


@dataclass(frozen=True)
class Forecast:
    """The predictions and the fit they came from."""

    predictions: list[Prediction]
    calibration: EngineCalibration
    residuals: tuple[Residual, ...]
    max_concurrency: dict[str, int]  # sequences the KV cache holds, plain and the method


def _used(s: Scenario) -> list[MeasuredPoint]:
    """The measurements the fit uses: plain's, and the scenario's method at its K with the
    scenario's acceptance (another method's acceptance is not known here)."""
    out = []
    for m in s.measurements:
        if m.method == "plain" or (m.method, m.k) == (s.method, s.k):
            al = None if m.method == "plain" else s.acceptance_length
            out.append(MeasuredPoint(m.method, m.k, m.concurrency, m.output_tokens_per_s, al))
    return out


def fit(s: Scenario, base: EngineCalibration) -> tuple[EngineCalibration, tuple[Residual, ...]]:
    """The calibration fitted to the scenario's measurements (overheads, achieved
    bandwidth and compute efficiency), and each measurement's residual."""
    points = [p for p in _used(s) if p.output_tokens_per_s > 0]
    if not points:
        return base, ()
    hw = Hardware(s.model, s.gpu, s.gpu_count, s.workload)
    cal = fit_calibration(hw, base, points)
    residuals = tuple(
        Residual(p.method, p.k, p.concurrency, p.output_tokens_per_s, predict_point(hw, cal, p))
        for p in points
    )
    return cal, residuals


def _anchored(
    modelled: Callable[[int], float], measured: Mapping[float, float], c: int
) -> tuple[float, bool]:
    """The measurement at c, else the model scaled to meet the nearest measurement (in
    log concurrency); True when measured."""
    if c in measured:
        return measured[c], True
    if not measured:
        return modelled(c), False
    near = min(measured, key=lambda m: abs(math.log(m / c)))
    return modelled(c) * measured[near] / modelled(max(round(near), 1)), False


def predict(s: Scenario, base: EngineCalibration | None = None) -> Forecast:
    """Predictions at each of the scenario's concurrencies: at a measured concurrency the
    measurement, elsewhere the fitted model anchored to the nearest measurement; a method
    measured nowhere keeps the fitted model's speedup over plain's prediction (a plain
    measurement the model cannot reach moves both alike)."""
    cal, residuals = fit(s, base or calibration.engine_calibration(s.engine))
    plain_model, model = step_model(s, cal, "plain", 0), step_model(s, cal, s.method, s.k)

    def measured(method: str, k: int) -> dict[float, float]:
        return {
            m.concurrency: m.output_tokens_per_s
            for m in s.measurements
            if (m.method, m.k) == (method, k) and m.output_tokens_per_s > 0
        }

    plain_seen, mine_seen = measured("plain", 0), measured(s.method, s.k)
    room = {
        name: max_concurrency(m, s.workload)
        for name, m in (("plain", plain_model), (s.method, model))
    }
    if not room["plain"] or not room[s.method]:
        raise PlanError(
            f"{s.model.name} with {s.method} does not fit on {s.gpu_count} x {s.gpu.name}: its "
            "weights leave no room for one sequence's KV cache; raise gpu_count"
        )

    def modelled(step: StepTimeModel, al: float, fits: int) -> Callable[[int], float]:
        # Past `fits` sequences vLLM preempts and the rest wait: throughput stays.
        return lambda n: output_tokens_per_s(step, min(n, fits), al, s.workload)

    plain_at = modelled(plain_model, 1.0, room["plain"])
    mine_at = modelled(model, s.acceptance_length, room[s.method])
    out = []
    for c in s.concurrency:
        plain, _ = _anchored(plain_at, plain_seen, c)
        if mine_seen:
            tps, seen = _anchored(mine_at, mine_seen, c)
        else:  # measured nowhere: the model's speedup over plain as plain was measured
            tps, seen = plain * mine_at(c) / plain_at(c), False
        out.append(
            Prediction(
                concurrency=c,
                plain_output_tokens_per_s=plain,
                method_output_tokens_per_s=tps,
                speedup=tps / plain,
                itl_ms=c / tps * 1000,  # a steady sequence's time per token
                usd_per_mtok=usd_per_mtok(s.price_usd_per_gpu_hour, s.gpu_count, tps),
                source="measured" if seen else "estimated",
            )
        )
    return Forecast(out, cal, residuals, room)


def predictions_json(forecast: Forecast) -> dict[str, Any]:
    """The contract's output document, with the fit: its parameters and, per measurement,
    the fitted model's value and residual (the measurement itself is what is predicted)."""
    cal = forecast.calibration
    return {
        "predictions": [p.__dict__ for p in forecast.predictions],
        "max_concurrency": forecast.max_concurrency,
        "fit": {
            "parameters": {name: getattr(cal, name) for name in FREE},
            "measurements": [
                {
                    "method": r.method,
                    "k": r.k,
                    "concurrency": r.concurrency,
                    "measured_output_tokens_per_s": r.measured_output_tokens_per_s,
                    "modelled_output_tokens_per_s": r.modelled_output_tokens_per_s,
                    "residual": r.relative,
                }
                for r in forecast.residuals
            ],
        },
    }
