"""The hardware's ceiling on output tokens/s, by hand from the catalog's datasheet figures."""

from __future__ import annotations

import pytest

from planner.ceiling import ceiling_exceeded, output_tokens_per_s_ceiling

# Qwen3-8B: 8.19e9 parameters in bf16, 16.38 GB read per step; 16.38 GFLOP per token.
# B200: 8.0 TB/s, 9,000 dense FP4 TFLOP/s (its fastest peak); H100: 3.35 TB/s, 1,979 FP8.
WEIGHTS_B = 16.38e9
FLOPS_PER_TOKEN = 16.38e9


@pytest.mark.parametrize(
    ("gpu", "gpus", "c", "per_step", "expected"),
    [
        ("B200", 1, 1, 1.0, 8.0e12 / WEIGHTS_B),  # 488: one stream, memory-bound
        ("B200", 1, 16, 1.0, 16 * 8.0e12 / WEIGHTS_B),  # the weights read once for 16
        ("B200", 1, 1, 4.0, 4 * 8.0e12 / WEIGHTS_B),  # four tokens kept per step
        ("B200", 2, 1, 1.0, 2 * 8.0e12 / WEIGHTS_B),  # two GPUs stream half each
        ("H100", 1, 1, 1.0, 3.35e12 / WEIGHTS_B),  # 205
        ("H100", 1, 4096, 1.0, 1979e12 / FLOPS_PER_TOKEN),  # compute-bound: the FP8 peak
        ("B200", 1, 0.5, 1.0, 8.0e12 / WEIGHTS_B),  # under one in flight: one stream's
    ],
)
def test_ceiling_by_hand(gpu: str, gpus: int, c: float, per_step: float, expected: float) -> None:
    got = output_tokens_per_s_ceiling("Qwen/Qwen3-8B", gpu, gpus, c, per_step)
    assert got == pytest.approx(expected)


def test_unknown_models_and_gpus_have_no_ceiling() -> None:
    assert output_tokens_per_s_ceiling("my/own-model", "B200", 1, 1, 1.0) is None
    assert output_tokens_per_s_ceiling("Qwen/Qwen3-8B", "TPU-v9", 1, 1, 1.0) is None


def test_a_point_is_over_only_past_the_margin() -> None:
    ceiling = 8.0e12 / WEIGHTS_B
    args = ("Qwen/Qwen3-8B", "B200", 1, 1.0, None)
    assert ceiling_exceeded(*args, 1.9 * ceiling, 2.0) is None
    assert ceiling_exceeded(*args, 2.1 * ceiling, 2.0) == pytest.approx(ceiling)
