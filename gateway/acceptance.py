"""Acceptance over many requests, from their own speculative decoding, with its interval (pure).

Each request that reported its speculation (vLLM's per-request spec decode metrics) gives
its verify steps s and accepted draft tokens a. Over a set of them the acceptance length is
1 + Σa / Σs, a ratio estimator, whose 95% half-width is 1.96 · √(Σ(a - R·s)² / (n(n - 1))) / s̄
with R = Σa / Σs and s̄ = Σs / n. The sums it needs (Σa², Σa·s, Σs²) are kept per hourly
rollup row, so any group over any period has its interval without reading the records.

A request's GPU time in a batched verify step does not depend on how many of its drafts
are accepted, so what a request costs is in proportion to its verify steps, not its tokens:
a class of requests whose acceptance length is L_class, served by a method whose requests
average L_all, costs L_all / L_class times the method's average price per token. Over the
same window these factors redistribute the method's cost among classes and never change
its total: Σ tokens_c · L_all / L_c = L_all · Σ steps_c = tokens_all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

Z95 = 1.96


@dataclass(frozen=True, slots=True)
class Acceptance:
    """The sums of a set of requests' own speculation."""

    requests: int = 0  # those that reported it
    steps: float = 0.0
    accepted: float = 0.0
    accepted_sq: float = 0.0
    accepted_steps: float = 0.0
    steps_sq: float = 0.0

    def __add__(self, other: Acceptance) -> Acceptance:
        return Acceptance(
            self.requests + other.requests,
            self.steps + other.steps,
            self.accepted + other.accepted,
            self.accepted_sq + other.accepted_sq,
            self.accepted_steps + other.accepted_steps,
            self.steps_sq + other.steps_sq,
        )

    @property
    def length(self) -> float | None:
        """Mean acceptance length, 1 + accepted / steps (None: no step reported)."""
        return 1 + self.accepted / self.steps if self.steps > 0 else None

    @property
    def half_width_95(self) -> float | None:
        """The 95% half-width of `length` (None: fewer than two requests)."""
        n = self.requests
        if n < 2 or self.steps <= 0:
            return None
        ratio = self.accepted / self.steps
        spread = self.accepted_sq - 2 * ratio * self.accepted_steps + ratio**2 * self.steps_sq
        return Z95 * math.sqrt(max(spread, 0.0) / (n * (n - 1))) / (self.steps / n)

    def interval_95(self) -> tuple[float, float] | None:
        length, half = self.length, self.half_width_95
        return None if length is None or half is None else (length - half, length + half)


@dataclass(frozen=True, slots=True)
class ClassPrice:
    """How a request class's own acceptance moves its method's price: the price per output
    token times `factor` (the method's acceptance length over the class's), known to within
    `relative_95` of itself; with the two acceptance lengths it came from."""

    factor: float
    relative_95: float
    class_length: float
    method_length: float
    requests: int


def class_price(own: Acceptance, method: Acceptance, min_requests: int) -> ClassPrice | None:
    """The class's price factor, when it has `min_requests` reports and both lengths are
    known; None: price it at the method's average."""
    if own.requests < min_requests:
        return None
    length, half, average = own.length, own.half_width_95, method.length
    if length is None or half is None or average is None:
        return None
    return ClassPrice(average / length, half / length, length, average, own.requests)
