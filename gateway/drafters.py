"""A drafter's own curve, where two drafters of one method serve side by side (a drafter
trial, or a fleet half-way through a drafter upgrade).

All their windows pool into the method's curve per (model, method, GPU): what `auto`
compares, what sizes the fleet, what the trial's traffic as a whole costs. Each drafter also
gets a curve of its own windows alone, drawn as any curve is (its measured points, the
planner's shape past them, the band saying how sure each part is), and its requests are
priced on it: the method's $/1M times the drafter's factor at the request's load, the
method's line over the drafter's there. The factor holds what the drafter's acceptance and
its own cost per step both do to the speed; the interval is the drafter's own band. Side by
side, two drafters' curves compare at the same concurrency, which their requests' costs do
not (the trial's side runs at its own share of the load). A drafter with no window of its
own yet is priced on the method's curve; its records say so (no factor).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gateway.curves import Aggregate, Band, CurveKey, Sample, Served, Variant, build_curves, pool
from planner.cost import ThroughputCurve

DrafterKey = tuple[str, str, str, str]  # (model, method, GPU type, drafter)


@dataclass(frozen=True, slots=True)
class DrafterCurve:
    """One drafter's curve: its line, how sure it is, and the pooled points it rests on."""

    line: ThroughputCurve
    band: Band
    measured: tuple[Aggregate, ...]


def drafter_curves(
    samples: Iterable[Sample], live: Mapping[CurveKey, set[Variant]], k: Mapping[CurveKey, int]
) -> dict[DrafterKey, DrafterCurve]:
    """A curve per drafter, on each curve whose enabled backends run two drafters or more
    (at the method curve's K), from the drafter's own windows of the versions served now."""
    shared = {key for key, variants in live.items() if len({d for d, _ in variants if d}) > 1}
    own: dict[DrafterKey, list[Sample]] = defaultdict(list)
    for s in samples:
        if s.key in shared and s.drafter and s.k == k.get(s.key):
            own[(*s.key, s.drafter)].append(s)
    found = {}
    for (model, method, gpu, drafter), drafted in own.items():
        key = (model, method, gpu)
        points, _ = pool(drafted, {key: live[key]})
        if not points:
            continue
        curves = build_curves(points, [Served(model, method, k[key], gpu)])
        if key in curves.lines:
            found[(*key, drafter)] = DrafterCurve(
                curves.lines[key], curves.bands[key], curves.measured[key]
            )
    return found


def drafter_factor(method_line: ThroughputCurve, drafter: DrafterCurve, c: float) -> float:
    """What one of the drafter's output tokens costs at c, over one of the method's."""
    return method_line.at(c) / drafter.line.at(c)
