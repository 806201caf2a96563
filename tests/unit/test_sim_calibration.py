"""The simulator reproduces the published figures it is calibrated to."""

from __future__ import annotations

from backends.sim.calibrate import Calibrator, report


def test_every_calibrated_figure_is_within_its_bar() -> None:
    lines, ok = report(steps=1500)
    misses = [line for line in lines if line.endswith("MISS")]
    assert ok, "\n".join(misses)
    assert sum(line.endswith(" ok") for line in lines) >= 45  # ALs, c=1 tok/s, ratios


def test_best_k_at_low_concurrency() -> None:
    calibrator = Calibrator(steps=1500)
    for workload in ("code", "chat", "mixed"):
        assert calibrator.best_k("eagle3", workload, 1) == 3
    for workload in ("code", "chat"):  # mixed: K=5 vs 7 is a near-tie (see the report)
        assert calibrator.best_k("p-eagle", workload, 1) == 7


def test_gains_shrink_as_concurrency_rises() -> None:
    calibrator = Calibrator(steps=1500)
    model = "openai/gpt-oss-20b", "B200"
    speedups = [
        calibrator.best(*model, "p-eagle", "code", c) / calibrator.best(*model, "plain", "code", c)
        for c in (1, 8, 64, 256)
    ]
    # Flat-ish up to moderate load (memory-bound steps), then falling as verification
    # competes for compute (the published charts show the same shape).
    assert speedups[0] > 1.8
    assert speedups[3] < speedups[2] < min(speedups[:2])
