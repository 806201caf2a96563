"""The step-time model: roofline terms, drafters, what-ifs across GPUs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner import calibration, catalog
from planner.calibration import EngineCalibration
from planner.specdec import StepShape, StepTimeModel, output_tokens_per_s

# A calibration with only the roofline, so expectations can be computed by hand.
ROOFLINE = EngineCalibration(
    name="roofline",
    step_overhead_s=0.0,
    per_seq_overhead_s=0.0,
    per_token_overhead_s=0.0,
    bandwidth_efficiency=1.0,
    compute_efficiency=1.0,
    drafter_pass_overhead_s=0.0,
    drafter_per_seq_overhead_s=0.0,
    drafter_per_token_layer_s=0.0,
    routing_correlation=1.0,
    source="test",
)
DECODE_1 = StepShape(
    decode_seqs=1, verify_tokens=1, drafted_tokens=0, prefill_tokens=0, context_tokens=0
)


def model(
    name: str, gpu: str = "H100", method: str = "plain", k: int = 0, **cal: float
) -> StepTimeModel:
    drafter = calibration.drafters().get(method) if k else None
    return StepTimeModel(
        catalog.model(name), catalog.gpu(gpu), 1, replace(ROOFLINE, **cal), drafter, k
    )


def test_dense_decode_at_batch_one_streams_the_weights() -> None:
    # Qwen3-8B: 8.19e9 params x 2 bytes over 3.35e12 B/s on an H100.
    assert model("Qwen/Qwen3-8B").step_s(DECODE_1) == pytest.approx(8.19e9 * 2 / 3.35e12)


def test_kv_reads_add_to_the_memory_term() -> None:
    shape = replace(DECODE_1, context_tokens=1000)
    kv = 1000 * 2 * 36 * 8 * 128 * 2  # tokens x K,V x layers x kv heads x head dim x bf16
    expected = (8.19e9 * 2 + kv) / 3.35e12
    assert model("Qwen/Qwen3-8B").step_s(shape) == pytest.approx(expected)


def test_large_batches_become_compute_bound() -> None:
    shape = StepShape(4096, 4096, 0, 0, 0)
    flops = 4096 * 2 * 8.19e9
    assert model("Qwen/Qwen3-8B").step_s(shape) == pytest.approx(flops / 989.5e12)


def test_moe_reads_only_the_experts_its_tokens_touch() -> None:
    gpt_oss = catalog.model("openai/gpt-oss-20b")
    one = model("openai/gpt-oss-20b").step_s(DECODE_1)
    dense = gpt_oss.weight_bytes() - gpt_oss.expert_weight_bytes()
    assert one == pytest.approx((dense + gpt_oss.expert_weight_bytes() * 4 / 32) / 3.35e12)
    many = model("openai/gpt-oss-20b").step_s(StepShape(64, 64, 0, 0, 0))
    touched = 1 - (1 - 4 / 32) ** 64  # 64 tokens, 4 of 32 experts each: nearly all
    assert many == pytest.approx((dense + gpt_oss.expert_weight_bytes() * touched) / 3.35e12)


def test_fixed_overheads_add() -> None:
    base = model("Qwen/Qwen3-8B").step_s(DECODE_1)
    with_overhead = model("Qwen/Qwen3-8B", step_overhead_s=0.001, per_seq_overhead_s=0.0001)
    assert with_overhead.step_s(DECODE_1) == pytest.approx(base + 0.0011)


def test_autoregressive_drafter_pays_k_passes_parallel_one() -> None:
    shape = StepShape(1, 4, 3, 0, 0)
    eagle3 = model("Qwen/Qwen3-8B", method="eagle3", k=3, drafter_pass_overhead_s=0.001)
    peagle = model("Qwen/Qwen3-8B", method="p-eagle", k=3, drafter_pass_overhead_s=0.001)
    head = 32000 * 4096  # draft vocabulary x hidden size
    layer = 12 * 4096 * 4096
    # Memory-bound passes: bf16 weights over the H100's 3.35 TB/s, plus the pass overhead.
    assert eagle3.drafter_s(shape) == pytest.approx(3 * (0.001 + (layer + head) * 2 / 3.35e12))
    assert peagle.drafter_s(shape) == pytest.approx(0.001 + (4 * layer + head) * 2 / 3.35e12)


def test_what_if_on_a_faster_gpu_keeps_acceptance_and_scales_time() -> None:
    workload = calibration.workloads()["chat"]
    h100 = output_tokens_per_s(model("Qwen/Qwen3-8B", "H100"), 1, 1.0, workload)
    b200 = output_tokens_per_s(model("Qwen/Qwen3-8B", "B200"), 1, 1.0, workload)
    assert b200 / h100 == pytest.approx(8.0 / 3.35, rel=0.05)  # bandwidth-bound


def test_speculative_gains_shrink_as_concurrency_rises() -> None:
    cal = calibration.engine_calibration()
    workload = calibration.workloads()["code"]
    profile = calibration.acceptance_profile("openai/gpt-oss-20b", "p-eagle", "code")
    assert profile is not None
    base = catalog.model("openai/gpt-oss-20b"), catalog.gpu("B200"), 1, cal
    plain = StepTimeModel(*base)
    spec = StepTimeModel(*base, calibration.drafters()["p-eagle"], 7)
    al = profile.mean_acceptance_length(7)
    speedups = [
        output_tokens_per_s(spec, c, al, workload) / output_tokens_per_s(plain, c, 1.0, workload)
        for c in (1, 8, 64, 256)
    ]
    assert speedups[0] > 1.5
    assert speedups[3] < speedups[2] < min(speedups[:2])
