"""GPU-hour cost: $ per 1M output tokens from a price and a throughput, and a throughput curve."""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

SECONDS_PER_HOUR = 3600.0


def usd_per_mtok(
    price_usd_per_gpu_hour: float, gpu_count: int, output_tokens_per_s: float
) -> float:
    """Capacity cost of 1M output tokens: GPU-hours held per token times the price."""
    if output_tokens_per_s <= 0:
        raise ValueError(f"output_tokens_per_s must be > 0, got {output_tokens_per_s}")
    usd_per_s = price_usd_per_gpu_hour * gpu_count / SECONDS_PER_HOUR
    return usd_per_s / output_tokens_per_s * 1e6


@dataclass(frozen=True)
class ThroughputCurve:
    """Output tokens/s against concurrency, from measured points (sorted by concurrency).

    Between points it interpolates linearly in log(concurrency); outside it holds the
    nearest point's per-sequence rate below and the last throughput above (saturation).
    """

    concurrency: tuple[float, ...]
    output_tokens_per_s: tuple[float, ...]

    @classmethod
    def from_points(cls, points: Sequence[tuple[float, float]]) -> ThroughputCurve:
        """A curve through (concurrency, tokens/s) points; duplicates are averaged."""
        merged: dict[float, list[float]] = {}
        for c, tps in points:
            if c > 0 and tps > 0:
                merged.setdefault(c, []).append(tps)
        if not merged:
            raise ValueError("a throughput curve needs at least one positive point")
        keys = sorted(merged)
        return cls(tuple(keys), tuple(sum(merged[c]) / len(merged[c]) for c in keys))

    def at(self, concurrency: float) -> float:
        """Aggregate output tokens/s at `concurrency` (at least 1)."""
        c = max(concurrency, 1.0)
        xs, ys = self.concurrency, self.output_tokens_per_s
        if c <= xs[0]:
            return ys[0] * c / xs[0]
        if c >= xs[-1]:
            return ys[-1]
        i = bisect.bisect_right(xs, c)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        t = (math.log(c) - math.log(x0)) / (math.log(x1) - math.log(x0))
        return y0 + t * (y1 - y0)
