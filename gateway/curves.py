"""Throughput curves per (model, method, GPU type): measured where measured, planned elsewhere.

A curve drawn through measurements alone knows nothing past its highest measured
concurrency (it saturates there), so a method that has only seen exploration traffic would
look hopeless at high load and the selector could never move to it. For models and GPUs in
the planner's catalog, the planner's prediction fills the concurrencies no measurement
covers, scaled to the measured points within an octave of the end it extends (their
geometric mean of measured over predicted); a method with a backend but no
measurement yet gets the prediction scaled by how far the planner is from the measured
methods of that model and GPU. Models outside the catalog keep curves from their
measurements only.

The prediction uses the planner's published calibration, not one refitted to these
measurements: a live fleet often has measured one method only, and four overhead and
bandwidth parameters fitted to one method's points bend the other methods' predictions
(a uniformly slower host reads as large drafter overheads and penalises sequential
drafters). Anchoring each curve to measurements corrects the level; the planner supplies
the shape. (`GET /admin/v1/plan` does fit, with its held-out error band.)
"""

# Over 400 lines: pooling measurements and the curves drawn from the pools share their statistics.

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from gateway.context import Context, context_model
from planner import calibration, catalog
from planner.calibration import EngineCalibration
from planner.catalog import UnknownCatalogEntry
from planner.cost import ThroughputCurve
from planner.fit_measurements import (
    Hardware,
    MeasuredPoint,
    concurrency_bin,
    predict_point,
    prefill_s_per_token,
)
from planner.recommend import CONCURRENCY

WORKLOAD = "chat"  # the traffic the planner assumes for live requests
CurveKey = tuple[str, str, str]  # (model, method, GPU type)
Variant = tuple[str | None, str | None]  # (drafter, engine version); None: not known


@dataclass(frozen=True, slots=True)
class Served:
    """A (method, K) some enabled backend of a model runs on a GPU type."""

    model: str
    method: str
    k: int
    gpu_type: str


@dataclass(frozen=True, slots=True)
class Sample:
    """One stored measurement as the curves read it: throughput per GPU, and its sample."""

    key: CurveKey
    k: int
    concurrency: float
    output_tokens_per_s: float
    acceptance_length: float | None = None
    requests: int | None = None  # None: the source did not say (weighs as one request)
    mean_output_tokens: float | None = None
    source: str = "scrape"
    mean_prompt_tokens: float | None = None
    drafter: str | None = None  # None: not known (an import, a row from before it was kept)
    engine_version: str | None = None


@dataclass(frozen=True, slots=True)
class Aggregate:
    """The measurements of a (model, method, GPU, K) in one concurrency bin, pooled: their
    request-weighted mean throughput per GPU, and how much and how spread the data is."""

    key: CurveKey
    k: int
    concurrency: float
    output_tokens_per_s: float
    acceptance_length: float | None
    requests: int = 1  # Σ requests of the pooled measurements
    points: int = 1  # measurements pooled
    spread: float = 0.0  # request-weighted standard deviation of tokens/s, relative to the mean
    sources: tuple[str, ...] = ("scrape",)
    # Request-weighted mean lengths of the measurements that said (None: none did)
    mean_prompt_tokens: float | None = None
    mean_output_tokens: float | None = None


# Points of one curve whose mean answer length is more than this factor from the curve's
# (request-weighted) median are kept out: 20-token answers do not run at 500-token speed.
SHAPE_RATIO = 4.0
# A point this many robust standard deviations (MAD x 1.4826) from its bin's median is an
# outlier (the modified z-score of Iglewicz and Hoaglin); bins of fewer points keep all.
OUTLIER_Z = 3.5
OUTLIER_MIN_POINTS = 3
# A bin of that many points or more whose request-weighted spread is above half its mean
# says nothing of the throughput there (mixed bursts spread a bin by about 0.25 in tests):
# its points are kept out as noise.
NOISE_SPREAD = 0.5
Rejections = dict[tuple[CurveKey, int], dict[str, int]]  # (curve, K) -> reason -> points

# How sure a curve is, as the relative 95% half-width of its throughput (to first order, of
# its $/1M). A measured point: 1.96 x its windows' spread / sqrt(windows); a point of one
# window, 1.96 x the spread one window shows on this curve. An estimate (the planner's shape
# past the measured points): 2.45 x the planner's mean error (a normal error's 1.96 sigma is
# 2.45 times its mean absolute value), that error checked on the curve's own measured points
# where it has two, never below the planner's error on the figures it was calibrated
# around; without two, its mean error on published sweeps it was not calibrated on. Past
# the points of a model the planner has no spec for, the curve is only held flat: +-100%.
Z_95 = 1.96
MEAN_ERROR_TO_95 = 2.45
CALIBRATED_ERROR = 0.07  # planner/ACCURACY.md: speedups over plain, held out
OUT_OF_SAMPLE_ERROR = 0.20  # the planner on dense models, GPUs and engines it never saw
UNPREDICTED = 1.0
# Past the measured points, the prediction is scaled to the points within this factor of
# concurrency of the end it extends (an octave: up to five quarter-octave bins).
ANCHOR_SPAN = 2.0


def pool(
    samples: Iterable[Sample], live: Mapping[CurveKey, set[Variant]] | None = None
) -> tuple[list[Aggregate], Rejections]:
    """Samples pooled per (model, method, GPU, K, concurrency bin), after the superseded,
    shape and outlier rules; what each rule kept out, per curve and K (pure). `live`: the
    (drafter, engine version) each curve's enabled backends run now."""
    by_curve: dict[tuple[CurveKey, int], list[Sample]] = defaultdict(list)
    for sample in samples:
        by_curve[(sample.key, sample.k)].append(sample)
    pooled: list[Aggregate] = []
    rejected: Rejections = {}
    for (key, k), every in by_curve.items():
        group = current(every, (live or {}).get(key))
        kept = _same_shape(group)
        counts = {"superseded": len(every) - len(group), "shape": len(group) - len(kept)}
        counts |= {"outlier": 0, "noise": 0}
        bins: dict[float, list[Sample]] = defaultdict(list)
        for sample in kept:
            bins[concurrency_bin(sample.concurrency)].append(sample)
        for c, members in sorted(bins.items()):
            good = _without_outliers(members)
            counts["outlier"] += len(members) - len(good)
            point = _pooled(key, k, c, good)
            if len(good) >= OUTLIER_MIN_POINTS and point.spread > NOISE_SPREAD:
                counts["noise"] += len(good)  # the planner's estimate, with its band, there
                continue
            pooled.append(point)
        if any(counts.values()):
            rejected[(key, k)] = {reason: n for reason, n in counts.items() if n}
    return pooled, rejected


def current(samples: list[Sample], live: set[Variant] | None) -> list[Sample]:
    """The samples taken with a drafter and engine version that a backend of their curve
    runs now. A drafter or engine upgrade changes the speed and the acceptance: the old
    points would price the new server, so the curve is measured again (the planner's
    estimate, with its wider band, stands in meanwhile). What does not say (a sample or a
    backend whose drafter or version is not known) matches any; a curve no backend serves
    keeps all its points (a sweep, an import: what the planner compares)."""
    if not live:
        return samples
    return [s for s in samples if any(_matches(s, variant) for variant in live)]


def _matches(sample: Sample, variant: Variant) -> bool:
    drafter, version = variant
    return (sample.drafter is None or drafter is None or sample.drafter == drafter) and (
        sample.engine_version is None or version is None or sample.engine_version == version
    )


def _weight(sample: Sample) -> int:
    return max(sample.requests or 1, 1)


def _weighted_median(values: list[tuple[float, int]]) -> float:
    ordered, half, seen = sorted(values), sum(w for _, w in values) / 2, 0
    for value, weight in ordered:
        seen += weight
        if seen >= half:
            return value
    return ordered[-1][0]


def _same_shape(samples: list[Sample]) -> list[Sample]:
    lengths = [(s.mean_output_tokens, _weight(s)) for s in samples if s.mean_output_tokens]
    if not lengths:
        return samples
    median = _weighted_median([(length, w) for length, w in lengths if length is not None])
    low, high = median / SHAPE_RATIO, median * SHAPE_RATIO
    return [s for s in samples if not s.mean_output_tokens or low <= s.mean_output_tokens <= high]


def _median(values: list[float]) -> float:
    ordered, n = sorted(values), len(values)
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def _without_outliers(samples: list[Sample]) -> list[Sample]:
    if len(samples) < OUTLIER_MIN_POINTS:
        return samples
    values = [s.output_tokens_per_s for s in samples]
    median = _median(values)
    mad = _median([abs(v - median) for v in values])
    if mad == 0:
        return samples
    return [s for s in samples if abs(s.output_tokens_per_s - median) / (1.4826 * mad) <= OUTLIER_Z]


def _pooled(key: CurveKey, k: int, c: float, samples: list[Sample]) -> Aggregate:
    weights = [_weight(s) for s in samples]
    total = sum(weights)
    mean = sum(w * s.output_tokens_per_s for w, s in zip(weights, samples, strict=True)) / total
    variance = sum(
        w * (s.output_tokens_per_s - mean) ** 2 for w, s in zip(weights, samples, strict=True)
    )
    seen_samples = list(zip(weights, samples, strict=True))
    seen = [(w, s.acceptance_length) for w, s in seen_samples]
    known = [(w, al) for w, al in seen if al is not None]
    al = sum(w * a for w, a in known) / sum(w for w, _ in known) if known else None
    return Aggregate(
        key,
        k,
        c,
        mean,
        al,
        requests=sum(s.requests or 0 for s in samples) or len(samples),
        points=len(samples),
        spread=math.sqrt(variance / total) / mean,
        sources=tuple(sorted({s.source for s in samples})),
        mean_prompt_tokens=_weighted_mean([(w, s.mean_prompt_tokens) for w, s in seen_samples]),
        mean_output_tokens=_weighted_mean([(w, s.mean_output_tokens) for w, s in seen_samples]),
    )


def _weighted_mean(values: list[tuple[int, float | None]]) -> float | None:
    known = [(w, v) for w, v in values if v is not None]
    total = sum(w for w, _ in known)
    return sum(w * v for w, v in known) / total if total else None


@dataclass(frozen=True, slots=True)
class Band:
    """How sure one curve is: the relative 95% half-width of its throughput at each measured
    concurrency (ascending), and everywhere else, where the curve is an estimate."""

    measured: tuple[tuple[float, float], ...]
    estimated: float
    # The planner's mean error on the curve's measured points, the shape its estimates rest
    # on (None: fewer than two points, or a model the planner has no spec for).
    planner_error: float | None = None

    def source(self, concurrency: float) -> Literal["measured", "estimated"]:
        """ "measured" within the measured points (interpolated between them)."""
        c, m = max(concurrency, 1.0), self.measured
        return "measured" if m and m[0][0] <= c <= m[-1][0] else "estimated"

    def relative_95(self, concurrency: float) -> float:
        """The half-width at a concurrency: interpolated between measured points."""
        if self.source(concurrency) == "estimated":
            return self.estimated
        c = max(concurrency, 1.0)
        for (c0, h0), (c1, h1) in itertools.pairwise(self.measured):
            if c0 <= c <= c1:
                return h0 + (h1 - h0) * (c - c0) / (c1 - c0)
        return self.measured[0][1]  # a single measured point, at c


@dataclass(frozen=True, slots=True)
class Prefill:
    """What prompt tokens cost on a curve's GPUs, and how many of them its throughput
    already paid for.

    A curve's tokens/s include the time its traffic spent prefilling: `prompt_per_output`
    prompt tokens per output token (the measurements' mean lengths, else the planner's
    workload). Pricing output at the curve alone charges every request as if its prompt
    were that long; with this, a request pays its output at the curve with that prefill
    taken out, and its own prompt at `s_per_token` (the planner's prefill model: the same
    for every method, so it never changes a saving)."""

    s_per_token: float  # GPU-seconds per prompt token
    prompt_per_output: float


@dataclass(frozen=True)
class Curves:
    """The lines that price requests, the measured points each rests on (at its K), how
    sure each line is, and what prompts cost on it (models the planner knows)."""

    lines: dict[CurveKey, ThroughputCurve]
    measured: dict[CurveKey, tuple[Aggregate, ...]]
    k: dict[CurveKey, int]
    bands: dict[CurveKey, Band]
    prefill: dict[CurveKey, Prefill]
    context: dict[CurveKey, Context]


def build_curves(points: Iterable[Aggregate], served: Iterable[Served]) -> Curves:
    """Curves for every measured key and every served (model, method, GPU)."""
    by_key: dict[CurveKey, list[Aggregate]] = defaultdict(list)
    for p in points:
        by_key[p.key].append(p)
    wanted = {(s.model, s.method, s.gpu_type): s.k for s in served}
    for key, rows in by_key.items():
        wanted.setdefault(key, max(r.k for r in rows))  # not served: its highest K measured
    curves = Curves({}, {}, {}, {}, {}, {})
    for key, k in wanted.items():
        rows = sorted(  # another K's points never mix in
            (r for r in by_key.get(key, []) if r.k == k), key=lambda r: r.concurrency
        )
        built = _curve(key, k, rows, by_key)
        if built is not None:
            curves.lines[key], curves.bands[key] = built
            curves.k[key], curves.measured[key] = k, tuple(rows)
            prefill = _prefill(key, rows)
            if prefill is not None:
                curves.prefill[key] = prefill
            line = curves.lines[key].concurrency
            context = context_model(*key, k, line, _lengths(rows), _mean_acceptance(rows))
            if context is not None:
                curves.context[key] = context
    return curves


def _lengths(rows: list[Aggregate]) -> tuple[float, float] | None:
    """The request-weighted mean prompt and output lengths of the rows that say."""
    known = [(r.requests, r.mean_prompt_tokens, r.mean_output_tokens) for r in rows]
    lengths = [(n, p, o) for n, p, o in known if p is not None and o is not None]
    total = sum(n for n, _, _ in lengths)
    if not total:
        return None
    return sum(n * p for n, p, _ in lengths) / total, sum(n * o for n, _, o in lengths) / total


def _prefill(key: CurveKey, rows: list[Aggregate]) -> Prefill | None:
    """The curve's prefill cost and the prompt share its throughput includes (None for a
    model or GPU the planner has no spec for: its prompts stay unpriced)."""
    hardware = _hardware(key[0], key[2])
    if hardware is None:
        return None
    workload = hardware.workload
    s_per_token = prefill_s_per_token(hardware, calibration.engine_calibration(),
                                      workload.prompt_tokens)  # fmt: skip
    known = [(r.requests, r.mean_prompt_tokens, r.mean_output_tokens) for r in rows]
    lengths = [(n, p, o) for n, p, o in known if p is not None and o]
    if lengths:
        prompt = sum(n * p for n, p, _ in lengths)
        output = sum(n * o for n, _, o in lengths if o is not None)
        return Prefill(s_per_token, prompt / output)
    return Prefill(s_per_token, workload.prompt_tokens / workload.output_tokens)


def _curve(
    key: CurveKey, k: int, rows: list[Aggregate], by_key: Mapping[CurveKey, list[Aggregate]]
) -> tuple[ThroughputCurve, Band] | None:
    hardware = _hardware(key[0], key[2])
    if hardware is None:
        if not rows:
            return None
        return ThroughputCurve.from_points(_pairs(rows)), _band(rows, UNPREDICTED)
    cal = calibration.engine_calibration()
    al = _mean_acceptance(rows)
    scale = 1.0  # with rows of its own, `extend` anchors the prediction to them
    if not rows:
        same = [r for (m, _, g), rs in by_key.items() if (m, g) == (key[0], key[2]) for r in rs]
        scale = _residual_scale(hardware, cal, same)
    predicted = {
        c: scale * predict_point(hardware, cal, MeasuredPoint(key[1], k, c, 0.0, al))
        for c in CONCURRENCY
    }
    error = _shape_error(hardware, cal, key[1], k, al, rows)
    estimated = MEAN_ERROR_TO_95 * (
        OUT_OF_SAMPLE_ERROR if error is None else max(error, CALIBRATED_ERROR)
    )
    band = _band(rows, estimated, error)
    return ThroughputCurve.from_points(extend(_pairs(rows), predicted)), band


def relative_95(point: Aggregate) -> float | None:
    """A pooled point's 95% half-width from its own windows (None from one window)."""
    return Z_95 * point.spread / math.sqrt(point.points) if point.points > 1 else None


def _band(rows: list[Aggregate], estimated: float, planner_error: float | None = None) -> Band:
    """Each measured point's half-width; one window's from the curve's spread (pure)."""
    several = [(r.requests, r.spread) for r in rows if r.points > 1]
    one_window = (
        Z_95 * sum(n * s for n, s in several) / sum(n for n, _ in several) if several else estimated
    )
    measured = [(r.concurrency, relative_95(r)) for r in rows if r.concurrency > 0]
    half_widths = tuple((c, one_window if h is None else h) for c, h in measured)
    return Band(half_widths, estimated, planner_error)


def _shape_error(
    hw: Hardware,
    cal: EngineCalibration,
    method: str,
    k: int,
    al: float | None,
    rows: list[Aggregate],
) -> float | None:
    """The planner's mean error on this curve's measured points, each predicted from the
    prediction anchored at its nearest other point, as the curve's estimates are (None
    with fewer than two points)."""
    rows = [r for r in rows if r.concurrency > 0]
    if len(rows) < 2:
        return None
    shape = {
        r.concurrency: predict_point(hw, cal, MeasuredPoint(method, k, r.concurrency, 0.0, al))
        for r in rows
    }
    errors = []
    for r in rows:
        anchor = min(
            (o for o in rows if o is not r),
            key=lambda o: abs(math.log(o.concurrency / r.concurrency)),
        )
        guess = shape[r.concurrency] * anchor.output_tokens_per_s / shape[anchor.concurrency]
        errors.append(abs(guess / r.output_tokens_per_s - 1))
    return sum(errors) / len(errors)


def extend(
    measured_points: list[tuple[float, float]], predicted: Mapping[int, float]
) -> list[tuple[float, float]]:
    """Measured points, plus predictions outside their range scaled to the measured points
    within an octave of that end (pure): the geometric mean of measured over predicted
    there, so one noisy end bin does not move every price beyond it."""
    if not measured_points:
        return [(float(c), tps) for c, tps in predicted.items()]
    ordered = sorted(measured_points)
    low, high = ordered[0][0], ordered[-1][0]
    out = list(measured_points)
    lows = [c for c in predicted if c < low]
    if lows:
        scale = _scale_to(predicted, [p for p in ordered if p[0] <= ANCHOR_SPAN * low])
        out += [(float(c), predicted[c] * scale) for c in lows]
    highs = [c for c in predicted if c > high]
    if highs:
        scale = _scale_to(predicted, [p for p in ordered if p[0] >= high / ANCHOR_SPAN])
        out += [(float(c), predicted[c] * scale) for c in highs]
    return out


def _scale_to(predicted: Mapping[int, float], points: list[tuple[float, float]]) -> float:
    """The geometric mean of measured over predicted at `points`."""
    logs = [math.log(tps / _predicted_at(predicted, c)) for c, tps in points]
    return math.exp(sum(logs) / len(logs))


def _predicted_at(predicted: Mapping[int, float], c: float) -> float:
    """The prediction at c, interpolated on the predicted grid."""
    return ThroughputCurve.from_points([(float(x), y) for x, y in predicted.items()]).at(c)


def _residual_scale(hw: Hardware, cal: EngineCalibration, rows: Iterable[Aggregate]) -> float:
    """How far the fitted prediction is from this (model, GPU)'s measurements, as a factor.

    The geometric mean of measured over predicted: a method never measured is priced as off
    as the measured ones are, not in different units (a slower host, a simulator scaled in
    time, a calibration the fit could not fully reach).
    """
    logs = [math.log(r.output_tokens_per_s / predict_point(hw, cal, _point(r))) for r in rows]
    return math.exp(sum(logs) / len(logs)) if logs else 1.0


def _hardware(model: str, gpu: str) -> Hardware | None:
    try:
        spec, hardware = catalog.model(model), catalog.gpu(gpu)
    except UnknownCatalogEntry:
        return None
    return Hardware(spec, hardware, 1, calibration.workloads()[WORKLOAD])


def _pairs(rows: Iterable[Aggregate]) -> list[tuple[float, float]]:
    return [(r.concurrency, r.output_tokens_per_s) for r in rows if r.concurrency > 0]


def _point(r: Aggregate) -> MeasuredPoint:
    return MeasuredPoint(r.key[1], r.k, r.concurrency, r.output_tokens_per_s, r.acceptance_length)


def _mean_acceptance(rows: list[Aggregate]) -> float | None:
    seen = [(r.requests, r.acceptance_length) for r in rows if r.acceptance_length is not None]
    total = sum(n for n, _ in seen)
    return sum(n * al for n, al in seen) / total if total else None
