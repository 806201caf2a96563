"""The live curves as the admin API shows them: the very lines that price requests."""

from __future__ import annotations

from gateway.curves import Aggregate, Band, CurveKey, relative_95
from gateway.registry import PRICE_KIND, Snapshot
from gateway.schemas.reports import (
    ContextModel,
    ContextSlope,
    Curve,
    CurveLinePoint,
    CurvePoint,
    CurvesReport,
    DrafterLine,
)
from planner.cost import usd_per_mtok


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
    line, band = snapshot.curves[key], snapshot.bands[key]
    price, prefill = snapshot.prices.get(gpu), snapshot.prefill.get(key)
    prompt = snapshot.prompt_usd_per_mtok(model, method, gpu)
    per_output = 0.0 if prefill is None or prompt is None else prefill.prompt_per_output * prompt
    return Curve(
        model=model,
        method=method,
        k=snapshot.curve_k.get(key, 0),
        gpu_type=gpu,
        usd_per_gpu_hour=price,
        measured=[_point(p) for p in snapshot.measured.get(key, ())],
        line=[
            _line_point(c, tps, price, band, per_output)
            for c, tps in zip(line.concurrency, line.output_tokens_per_s, strict=True)
        ],
        estimated_relative_95=band.estimated,
        prompt_usd_per_mtok=prompt,
        prompt_tokens_per_output_token=None if prefill is None else prefill.prompt_per_output,
        rejected=snapshot.rejected.get((key, snapshot.curve_k.get(key, 0)), {}),
        drafters=_drafters(snapshot, key, per_output),
        context=_context(snapshot, key),
    )


def _context(snapshot: Snapshot, key: CurveKey) -> ContextModel | None:
    context = snapshot.context.get(key)
    if context is None:
        return None
    return ContextModel(
        mean_context_tokens=context.mean_tokens,
        acceptance_length=context.acceptance,
        slope=[
            ContextSlope(concurrency=c, s_per_context_token=k, kv_share=f)
            for c, k, f in context.slope
        ],
    )


def _drafters(snapshot: Snapshot, key: CurveKey, per_output: float) -> list[DrafterLine]:
    """Each drafter's own curve, where two drafters of the curve's method serve."""
    price = snapshot.prices.get(key[2])
    return [
        DrafterLine(
            drafter=d,
            measured=[_point(p) for p in own.measured],
            line=[
                _line_point(c, tps, price, own.band, per_output)
                for c, tps in zip(own.line.concurrency, own.line.output_tokens_per_s, strict=True)
            ],
            estimated_relative_95=own.band.estimated,
        )
        for (model, method, gpu, d), own in sorted(snapshot.drafters.items())
        if (model, method, gpu) == key
    ]


def _line_point(
    c: float, tps: float, price: float | None, band: Band, prefill_per_output: float
) -> CurveLinePoint:
    usd, half = None if price is None else usd_per_mtok(price, 1, tps), band.relative_95(c)
    return CurveLinePoint(
        concurrency=c,
        output_tokens_per_s=tps,
        usd_per_mtok=usd,
        output_usd_per_mtok=None if usd is None else max(usd - prefill_per_output, 0.0),
        relative_95=half,
        usd_per_mtok_95=None if usd is None else (usd * max(1 - half, 0.0), usd * (1 + half)),
        source=band.source(c),
    )


def _point(p: Aggregate) -> CurvePoint:
    return CurvePoint(
        concurrency=p.concurrency,
        output_tokens_per_s=p.output_tokens_per_s,
        requests=p.requests,
        points=p.points,
        relative_spread=p.spread,
        relative_interval_95=relative_95(p),
        acceptance_length=p.acceptance_length,
        sources=list(p.sources),
    )
