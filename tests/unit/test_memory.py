"""Memory: the sequences the KV cache holds beside the target and its drafter."""

from __future__ import annotations

import pytest

from planner import calibration, catalog
from planner.memory import kv_capacity_bytes, max_concurrency
from planner.predict import PlanError, parse_scenario, predict
from planner.recommend import DoesNotFit, grid
from planner.specdec import StepTimeModel

CHAT = calibration.workloads()["chat"]  # 100 prompt, 1200 output tokens


def step(model: str, gpu: str, method: str = "plain", k: int = 0) -> StepTimeModel:
    drafter = calibration.drafters().get(method) if k else None
    return StepTimeModel(
        catalog.model(model), catalog.gpu(gpu), 1, calibration.engine_calibration(), drafter, k
    )


def test_qwen3_8b_on_an_h100_by_hand() -> None:
    plain = step("Qwen/Qwen3-8B", "H100")
    # 0.9 of 80 GB, less 3 GB of runtime and 8.19B bf16 weights.
    assert kv_capacity_bytes(plain) == pytest.approx(80e9 * 0.9 - 3e9 - 8.19e9 * 2)
    per_token = 36 * 2 * 8 * 128 * 2  # layers x (K, V) x kv heads x head dim x bf16
    assert max_concurrency(plain, CHAT) == int(kv_capacity_bytes(plain) // (700 * per_token))
    # DFlash: 5 drafter layers of KV per token, its weights, and 15 slots per sequence.
    dflash = step("Qwen/Qwen3-8B", "H100", "dflash", 15)
    expected = kv_capacity_bytes(dflash) // (715 * per_token * (36 + 5) / 36)
    assert max_concurrency(dflash, CHAT) == int(expected)
    assert max_concurrency(dflash, CHAT) < max_concurrency(plain, CHAT)


def test_past_the_kv_cache_throughput_stays_and_the_wait_grows() -> None:
    scenario = {
        "model": "openai/gpt-oss-120b",
        "gpu": "H100",
        "method": "eagle3",
        "k": 3,
        "acceptance_length": 2.7,
        "concurrency": [256, 512],
    }
    forecast = predict(parse_scenario(scenario))
    room = forecast.max_concurrency
    assert 0 < room["eagle3"] < room["plain"] < 256  # 65 GB of weights on 80 GB
    at_256, at_512 = forecast.predictions
    assert at_512.method_output_tokens_per_s == pytest.approx(at_256.method_output_tokens_per_s)
    assert at_512.itl_ms == pytest.approx(2 * at_256.itl_ms)


def test_a_model_that_does_not_fit_is_refused() -> None:
    scenario = {"model": "deepseek-ai/DeepSeek-V4-Flash", "gpu": "H100", "method": "plain"}
    with pytest.raises(PlanError, match="does not fit on 1 x H100"):
        predict(parse_scenario(scenario))
    with pytest.raises(DoesNotFit, match="use more GPUs"):
        grid("deepseek-ai/DeepSeek-V4-Flash", "H100")
    assert grid("deepseek-ai/DeepSeek-V4-Flash", "H100", gpu_count=4)
