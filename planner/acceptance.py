"""Acceptance of draft tokens: per-position profiles and the acceptance length they imply."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from operator import mul

MAX_POSITIONS = 16
MAX_CONDITIONAL = 0.995  # a drafter is never certain
BISECTIONS = 45  # halvings of an interval under 1: to 3e-14, far below any published digit


@dataclass(frozen=True, slots=True)
class AcceptanceProfile:
    """Conditional acceptance per draft position: p[i] = P(accept i | accepted 0..i-1).

    Acceptance depends on the model, drafter and traffic, not on the hardware.
    """

    conditional: tuple[float, ...]

    @classmethod
    def geometric(
        cls, first: float, decay: float, positions: int = MAX_POSITIONS
    ) -> AcceptanceProfile:
        """p[i] = first * decay**i, capped below 1."""
        return cls(tuple(min(MAX_CONDITIONAL, first * decay**i) for i in range(positions)))

    def survival(self, k: int) -> tuple[float, ...]:
        """Unconditional acceptance of positions 0..k-1, as vLLM's per-position counters see it."""
        return tuple(accumulate(self.conditional[:k], mul))

    def mean_acceptance_length(self, k: int) -> float:
        """Expected tokens per step with K drafts, bonus token included: 1 + sum of survivals."""
        return 1.0 + sum(self.survival(k))

    def scaled(self, factor: float) -> AcceptanceProfile:
        """The profile of an easier (factor > 1) or harder (< 1) request."""
        return AcceptanceProfile(tuple(min(MAX_CONDITIONAL, p * factor) for p in self.conditional))


def fit_geometric(points: dict[int, float], decay: float | None = None) -> tuple[float, float]:
    """(first, decay) whose geometric profile has the given acceptance length per K.

    Two or more points fit both parameters; one point needs `decay` given.
    """
    if not points:
        raise ValueError("no acceptance-length points to fit")
    if decay is not None or len(points) == 1:
        if decay is None:
            raise ValueError(f"one point {points} fits `first` only; pass a decay")
        while _error_at(points, decay, max(points)) < -1e-6 and decay < 1.0:
            decay += 0.005  # too steep a decay cannot reach a high acceptance length
        return _solve_first(points, decay), decay
    lo, hi = 0.5, 1.2
    for _ in range(BISECTIONS):  # bisect on decay; `first` is solved exactly for each
        mid = (lo + hi) / 2
        if _error_at(points, mid, max(points)) > 0:
            hi = mid
        else:
            lo = mid
    return _solve_first(points, lo), lo


def _solve_first(points: dict[int, float], decay: float) -> float:
    """The `first` that matches the smallest-K point, for a fixed decay."""
    k, target = min(points.items())
    lo, hi = 0.0, 1.0
    for _ in range(BISECTIONS):
        mid = (lo + hi) / 2
        if AcceptanceProfile.geometric(mid, decay, k).mean_acceptance_length(k) > target:
            hi = mid
        else:
            lo = mid
    return lo


def _error_at(points: dict[int, float], decay: float, k: int) -> float:
    """Acceptance-length error at `k` when `first` matches the smallest K."""
    profile = AcceptanceProfile.geometric(_solve_first(points, decay), decay)
    return profile.mean_acceptance_length(k) - points[k]
