"""The live curves as the admin API shows them: the very lines that price requests."""

from __future__ import annotations

import math

from gateway.curves import Aggregate, CurveKey
from gateway.registry import PRICE_KIND, Snapshot
from gateway.reports import Curve, CurveLinePoint, CurvePoint, CurvesReport
from planner.cost import usd_per_mtok

Z_95 = 1.96


def curves_report(snapshot: Snapshot, model: str | None, gpu: str | None) -> CurvesReport:
    """Every curve of the snapshot, optionally of one model and GPU type."""
    keys = sorted(
        key
        for key in snapshot.curves
        if (model is None or key[0] == model) and (gpu is None or key[2] == gpu)
    )
    return CurvesReport(price_kind=PRICE_KIND, curves=[_curve(snapshot, key) for key in keys])


def _curve(snapshot: Snapshot, key: CurveKey) -> Curve:
    model, method, gpu = key
    line, measured = snapshot.curves[key], snapshot.measured.get(key, ())
    price = snapshot.prices.get(gpu)
    at_measured = {p.concurrency: p for p in measured}
    return Curve(
        model=model,
        method=method,
        k=snapshot.curve_k.get(key, 0),
        gpu_type=gpu,
        usd_per_gpu_hour=price,
        measured=[_point(p) for p in measured],
        line=[
            CurveLinePoint(
                concurrency=c,
                output_tokens_per_s=tps,
                usd_per_mtok=None if price is None else usd_per_mtok(price, 1, tps),
                usd_per_mtok_95=_interval(price, tps, at_measured.get(c)),
                source="measured" if c in at_measured else "estimated",
            )
            for c, tps in zip(line.concurrency, line.output_tokens_per_s, strict=True)
        ],
        rejected=snapshot.rejected.get((key, snapshot.curve_k.get(key, 0)), {}),
    )


def _relative_95(p: Aggregate) -> float | None:
    return Z_95 * p.spread / math.sqrt(p.points) if p.points > 1 else None


def _interval(
    price: float | None, tps: float, point: Aggregate | None
) -> tuple[float, float] | None:
    """The $/1M a measured point's 95% throughput interval spans (cost is 1/throughput)."""
    half = None if point is None else _relative_95(point)
    if price is None or half is None:
        return None
    high_tps, low_tps = tps * (1 + half), tps * max(1 - half, 1e-9)
    return usd_per_mtok(price, 1, high_tps), usd_per_mtok(price, 1, low_tps)


def _point(p: Aggregate) -> CurvePoint:
    return CurvePoint(
        concurrency=p.concurrency,
        output_tokens_per_s=p.output_tokens_per_s,
        requests=p.requests,
        points=p.points,
        relative_spread=p.spread,
        relative_interval_95=_relative_95(p),
        acceptance_length=p.acceptance_length,
        sources=list(p.sources),
    )
