"""Acceptance profiles: survival, acceptance length, fitting to published points."""

from __future__ import annotations

import pytest

from planner.acceptance import AcceptanceProfile, fit_geometric
from planner.calibration import acceptance_points, acceptance_profile


@pytest.mark.parametrize(
    ("conditional", "k", "survival", "length"),
    [
        ((0.5, 0.5, 0.5), 3, (0.5, 0.25, 0.125), 1.875),
        ((0.8, 0.5), 2, (0.8, 0.4), 2.2),
        ((0.8, 0.5), 1, (0.8,), 1.8),
        ((1.0, 1.0, 0.0), 3, (1.0, 1.0, 0.0), 3.0),
    ],
)
def test_survival_and_length(
    conditional: tuple[float, ...], k: int, survival: tuple[float, ...], length: float
) -> None:
    profile = AcceptanceProfile(conditional)
    assert profile.survival(k) == pytest.approx(survival)
    assert profile.mean_acceptance_length(k) == pytest.approx(length)


def test_geometric_profile_decays_and_caps() -> None:
    profile = AcceptanceProfile.geometric(0.9, 0.5, positions=3)
    assert profile.conditional == pytest.approx((0.9, 0.45, 0.225))
    assert max(AcceptanceProfile.geometric(1.2, 1.0, 4).conditional) < 1.0


@pytest.mark.parametrize(
    "points",
    [
        {3: 3.02, 7: 3.94},  # P-EAGLE HumanEval (GPT-OSS-20B)
        {3: 2.24, 7: 2.59},  # EAGLE-3 SPEED-Bench
        {3: 2.70, 7: 3.27},  # EAGLE-3 MT-Bench
    ],
)
def test_two_points_fit_both_parameters(points: dict[int, float]) -> None:
    first, decay = fit_geometric(points)
    profile = AcceptanceProfile.geometric(first, decay)
    for k, length in points.items():
        assert profile.mean_acceptance_length(k) == pytest.approx(length, abs=1e-3)


def test_one_point_needs_a_decay_and_raises_it_when_unreachable() -> None:
    with pytest.raises(ValueError, match="pass a decay"):
        fit_geometric({7: 4.0})
    first, decay = fit_geometric({7: 6.17}, decay=0.95)  # unreachable with decay 0.95
    assert decay > 0.95
    assert AcceptanceProfile.geometric(first, decay).mean_acceptance_length(7) == pytest.approx(
        6.17, abs=1e-3
    )


def test_every_published_point_is_reproduced_by_its_profile() -> None:
    for point in acceptance_points():
        model = "openai/gpt-oss-20b" if point.model == "*" else point.model
        profile = acceptance_profile(model, point.method, point.workload)
        assert profile is not None
        got = profile.mean_acceptance_length(point.k)
        assert got == pytest.approx(point.acceptance_length, rel=0.005), point


def test_plain_has_no_profile_and_unknown_workloads_fall_back() -> None:
    assert acceptance_profile("openai/gpt-oss-20b", "plain", "chat") is None
    fallback = acceptance_profile("openai/gpt-oss-20b", "p-eagle", "math")
    chat = acceptance_profile("openai/gpt-oss-20b", "p-eagle", "chat")
    assert fallback == chat
