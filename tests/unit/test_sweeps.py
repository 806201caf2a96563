"""The published load sweeps (reference 5.6-5.8) as calibration data, and the step-time
model fitted to them: a speedup that falls with load, and long blocks that stop paying."""

from __future__ import annotations

from collections import Counter

import pytest

from planner import calibration, catalog, heldout, sweeps
from planner.calibration import SweepPoint

MODELS = {"5.6": "Qwen/Qwen3.5-27B", "5.7": "Qwen/Qwen3.6-35B-A3B",
          "5.8": "deepseek-ai/DeepSeek-V4-Pro"}  # fmt: skip


def _section(section: str) -> list[SweepPoint]:
    return [p for p in calibration.sweep_points() if p.section == section]


def _speedups(section: str) -> dict[tuple[str, int, str, int], tuple[float, float]]:
    """(method, K, dataset, c) -> (published, modelled) speedup over plain, on the data
    file's coefficients."""
    points = _section(section)
    cal = calibration.engine_calibration(points[0].engine)
    return {
        (r.point.method, r.point.k or 0, r.point.dataset, r.point.concurrency): (
            published,
            modelled,
        )
        for r, published, modelled in sweeps.speedups(sweeps.modelled(cal, points))
    }


def test_each_section_is_one_configuration_across_loads() -> None:
    counts = Counter(p.section for p in calibration.sweep_points())
    assert counts == {"5.6": 100, "5.7": 72, "5.8": 36}
    for section, model in MODELS.items():
        points = _section(section)
        assert {(p.model, p.gpu, p.gpu_count) for p in points} == {
            (model, points[0].gpu, points[0].gpu_count)
        }
        catalog.model(model), catalog.gpu(points[0].gpu)  # both catalogued
        for p in points:
            assert (p.method == "plain") == (p.k is None), p
            assert p.method == "plain" or p.method in calibration.drafters(), p


def test_no_sweep_is_both_calibration_and_held_out() -> None:
    held = {p.model for p in heldout.points()}
    assert not held & set(MODELS.values())


def test_a_sweep_without_published_acceptance_meets_its_lowest_load() -> None:
    """5.8 publishes no acceptance: the one its c=1 point implies reproduces that point."""
    points = [p for p in _section("5.8") if p.method != "plain"]
    assert all(p.acceptance_length is None for p in points)
    rows = sweeps.modelled(calibration.engine_calibration("vllm"), points)
    lowest = [r for r in rows if r.point.concurrency == 1]
    assert len(lowest) == 5
    for r in lowest:
        assert r.output_tokens_per_s == pytest.approx(r.point.output_tokens_per_s, rel=0.01)
        assert 1 < r.acceptance_length <= (r.point.k or 0) + 1


def test_on_the_expert_parallel_moe_a_long_block_stops_paying_under_load() -> None:
    """5.8: from c=128 on, K=3 beats K=5, 6 and 7, published and modelled alike, and each
    K's speedup is lower at c=256 than at c=64."""
    speedups = _speedups("5.8")
    dataset = "SPEED-Bench qualitative"
    for c in (128, 256):
        for which in (0, 1):  # published, modelled
            at = {k: speedups[("dspark", k, dataset, c)][which] for k in (3, 5, 6, 7)}
            assert max(at, key=at.__getitem__) == 3, (c, which, at)
    for k in (3, 5, 6, 7):
        assert speedups[("dspark", k, dataset, 256)][1] < speedups[("dspark", k, dataset, 64)][1]


def test_on_the_moe_and_the_dense_model_the_speedup_falls_with_load() -> None:
    """5.6 and 5.7: the modelled speedup at c=32 is below its c=1 one for every method,
    dataset and block size, as the published ones are (the planner once had it grow on
    MoE)."""
    for section in ("5.6", "5.7"):
        speedups = _speedups(section)
        for (method, k, dataset, c), (published, modelled) in speedups.items():
            if c != 32:
                continue
            low_published, low_modelled = speedups[(method, k, dataset, 1)]
            assert published < low_published, (section, method, k, dataset)
            assert modelled < low_modelled, (section, method, k, dataset)


def test_the_implied_acceptances_in_the_catalog_are_the_sweeps() -> None:
    """DeepSeek-V4-Pro's DSpark acceptance by K is what 5.8's c=1 point implies under the
    data file's coefficients (a refit that moves them must move these too)."""
    points = [p for p in _section("5.8") if p.method != "plain"]
    implied = {
        key[3]: al
        for key, al in sweeps.acceptances(calibration.engine_calibration("vllm"), points).items()
    }
    stored = {
        a.k: a.acceptance_length
        for a in calibration.acceptance_points()
        if a.model == MODELS["5.8"] and a.method == "dspark"
    }
    assert implied.keys() == {1, 3, 5, 6, 7}
    assert stored.keys() == {3, 7}  # two points a geometric profile meets exactly
    for k, al in stored.items():
        assert al == pytest.approx(implied[k], abs=0.01), k
    profile = calibration.acceptance_profile(MODELS["5.8"], "dspark", "mixed")
    assert profile is not None
    for k in (1, 5, 6):  # the profile's others stay near what the sweep implies
        assert profile.mean_acceptance_length(k) == pytest.approx(implied[k], rel=0.06), k


def test_what_sglangs_one_gpu_sweeps_cannot_show_is_vllms() -> None:
    """Collectives cost nothing on one GPU, so 5.6 and 5.7 cannot fit them: SGLang's are
    vLLM's, fitted on 5.8 across eight GPUs, and a step on eight GPUs pays them."""
    from planner.calibrate import SWEEP_SECTIONS, SWEEP_TERMS, shown

    one_gpu = [p for p in calibration.sweep_points() if p.section in SWEEP_SECTIONS["sglang"]]
    unseen = set(SWEEP_TERMS["sglang"]) - set(shown(SWEEP_TERMS["sglang"], one_gpu))
    assert unseen == {"collective_per_layer_s", "collective_per_token_layer_s"}
    sglang, vllm = calibration.engine_calibration("sglang"), calibration.engine_calibration("vllm")
    for name in unseen:
        assert getattr(sglang, name) == getattr(vllm, name) > 0
