"""Altair charts of the dashboard, built from the admin API's typed records."""

from __future__ import annotations

import datetime as dt
from itertools import pairwise
from typing import Any

import altair as alt

from dashboard.schemas import AccuracyPoint, Curve, PlanPoint, UsageRow

Rows = list[dict[str, Any]]
CAPACITY, BELOW_PLAIN = "capacity cost", "capacity cost below plain"  # never money saved
# Solid where the planner's point is a measurement, dashed where it is estimated: fixed, or
# Vega-Lite would give the first kind present the solid line (all solid with no measurement).
SOURCE_DASHES = alt.Scale(domain=["measured", "estimated"], range=[[1, 0], [6, 4]])


# One strong colour per method, the same on every chart (its planner line, its measured
# points, its live curve): Vega's default palette gives later series pale shades.
METHOD_COLOURS = {
    "plain": "#4c4c4c", "eagle3": "#1f77b4", "p-eagle": "#d62728", "dflash": "#2ca02c",
    "dspark": "#9467bd", "ngram": "#ff7f0e", "suffix": "#8c564b", "mtp": "#e377c2",
    "draft_model": "#17becf",
}  # fmt: skip
OTHER_COLOUR = "#7f7f7f"


def _method_of(series: str) -> str:
    """The method a series is drawn for: `p-eagle`, `measured: p-eagle`, `p-eagle K=7`."""
    return series.removeprefix("measured: ").split(" K=")[0]


def _colours(rows: Rows) -> alt.Scale:
    """Each series in `rows` in its method's colour."""
    series = sorted({r["series"] for r in rows})
    colours = [METHOD_COLOURS.get(_method_of(s), OTHER_COLOUR) for s in series]
    return alt.Scale(domain=series, range=colours)


def _legend(title: str) -> alt.Legend:
    """A legend under the chart, labels whole: a long method name is never cut off."""
    return alt.Legend(title=title, orient="bottom", labelLimit=0, columns=3)


def _chart(rows: Rows) -> alt.Chart:
    chart: alt.Chart = alt.Chart(alt.Data(values=rows))  # type: ignore[no-untyped-call]
    return chart


def _segments(curves: dict[str, list[PlanPoint]]) -> Rows:
    """Each method's line as segments between consecutive points: `measured` where both
    ends are measured, else `estimated` (drawn dashed)."""
    rows = []
    for method, points in curves.items():
        for i, (a, b) in enumerate(pairwise(points)):
            kind = "measured" if a.source == b.source == "measured" else "estimated"
            for p in (a, b):
                rows.append(
                    {"concurrency": p.concurrency, "tokens_per_s": p.output_tokens_per_s,
                     "series": method, "kind": kind, "segment": f"{method}/{i}"}
                )  # fmt: skip
    return rows


def throughput_vs_concurrency(
    curves: dict[str, list[PlanPoint]], measured: list[AccuracyPoint], gpu_count: int
) -> alt.LayerChart:
    """Every method's planner curve (its best K per load), solid between measured points and
    dashed where estimated, its points filled where measured, and every measured point."""
    x = alt.X("concurrency:Q", scale=alt.Scale(type="log", base=2), title="concurrency")
    y = alt.Y("tokens_per_s:Q", title="output tokens/s")
    segments, dots = _segments(curves), _measured_dots(measured, gpu_count)
    scale = _colours(segments + dots)
    color = alt.Color("series:N", legend=_legend("method"), scale=scale)
    lines = (
        _chart(segments)
        .mark_line()
        .encode(
            x=x,
            y=y,
            color=color,
            detail="segment:N",
            strokeDash=alt.StrokeDash(
                "kind:N", title="planner line", scale=SOURCE_DASHES, legend=_legend("line")
            ),
        )
    )
    planner_points = (
        _chart(_planner_points(curves))
        .mark_point(size=40)
        .encode(
            x=x,
            y=y,
            color=color,
            fill=alt.condition(
                alt.datum.kind == "measured",
                alt.Color("series:N", scale=scale),
                alt.value("white"),
            ),
            tooltip=["series:N", "K:Q", "concurrency:Q", "tokens_per_s:Q", "kind:N"],
        )
    )
    marks = (
        _chart(dots)
        .mark_point(size=90, filled=True, shape="diamond")
        .encode(
            x=x,
            y=y,
            color=color,
            tooltip=["series:N", "concurrency:Q", "tokens_per_s:Q"],
        )
    )
    layers = [lines, planner_points, marks] if measured else [lines, planner_points]
    layered: alt.LayerChart = alt.LayerChart(layer=layers)
    return layered


def _planner_points(curves: dict[str, list[PlanPoint]]) -> Rows:
    """Every point of every method's planner curve, with its K and whether it was measured."""
    return [
        {
            "concurrency": p.concurrency,
            "tokens_per_s": p.output_tokens_per_s,
            "series": method,
            "kind": p.source,
            "K": p.k,
        }
        for method, points in curves.items()
        for p in points
    ]


def _measured_dots(measured: list[AccuracyPoint], gpu_count: int) -> Rows:
    """Every measured point, scaled to the plan's GPUs."""
    return [
        {
            "concurrency": p.concurrency,
            "series": f"measured: {p.method}",
            "tokens_per_s": p.measured_output_tokens_per_s * gpu_count,
        }
        for p in measured
    ]


def live_curves(curves: list[Curve]) -> alt.LayerChart:
    """The curves that price requests: each method's line with its 95% band, its points
    filled where measured and hollow where estimated, and the pooled measured points."""
    rows = [
        {
            "concurrency": p.concurrency,
            "tokens_per_s": p.output_tokens_per_s,
            "low": p.output_tokens_per_s * max(1 - p.relative_95, 0.0),
            "high": p.output_tokens_per_s * (1 + p.relative_95),
            "series": f"{c.method} K={c.k}",
            "source": p.source,
            "band": f"±{p.relative_95:.0%}",
            "usd_per_mtok": p.usd_per_mtok,
        }
        for c in curves
        for p in c.line
    ]
    x = alt.X("concurrency:Q", scale=alt.Scale(type="log", base=2), title="concurrency")
    y = alt.Y("tokens_per_s:Q", title="output tokens/s per GPU")
    scale = _colours(rows)
    color = alt.Color("series:N", legend=_legend("method"), scale=scale)
    band = _chart(rows).mark_area(opacity=0.15).encode(x=x, y="low:Q", y2="high:Q", color=color)
    line = _chart(rows).mark_line().encode(x=x, y=y, color=color)
    points = (
        _chart(rows)
        .mark_point(size=50)
        .encode(
            x=x,
            y=y,
            color=color,
            fill=alt.condition(
                alt.datum.source == "measured",
                alt.Color("series:N", scale=scale),
                alt.value("white"),
            ),
            tooltip=["series:N", "concurrency:Q", "tokens_per_s:Q", "source:N", "band:N",
                     "usd_per_mtok:Q"],
        )
    )  # fmt: skip
    layered: alt.LayerChart = alt.LayerChart(layer=[band, line, points])
    return layered


def usage_by_model(rows: list[UsageRow]) -> alt.Chart:
    """Capacity cost and its difference from plain decoding per model and method."""
    values = [
        {"model": r.model, "method": r.method, "figure": figure, "usd": usd}
        for r in rows
        for figure, usd in ((CAPACITY, r.cost_usd), (BELOW_PLAIN, r.savings_usd))
    ]
    chart: alt.Chart = (
        _chart(values)
        .mark_bar()
        .encode(
            x=alt.X("usd:Q", title="USD"),
            y="method:N",
            color="figure:N",
            yOffset="figure:N",
            row="model:N",
            tooltip=["model:N", "method:N", "figure:N", "usd:Q"],
        )
    )
    return chart


def predicted_vs_measured(points: list[AccuracyPoint]) -> alt.LayerChart:
    """Each measured point against the planner's held-out prediction, beside the line y = x
    where a perfect prediction would lie."""
    values = [
        {
            "measured": p.measured_output_tokens_per_s,
            "predicted": p.predicted_output_tokens_per_s,
            "method": p.method,
            "model": p.model,
            "concurrency": p.concurrency,
        }
        for p in points
        if p.predicted_output_tokens_per_s is not None
    ]
    dots = (
        _chart(values)
        .mark_circle(size=80)
        .encode(
            x=alt.X("measured:Q", title="measured output tokens/s per GPU"),
            y=alt.Y("predicted:Q", title="predicted output tokens/s per GPU"),
            color=alt.Color("method:N", scale=_colours([{"series": v["method"]} for v in values])),
            tooltip=["model:N", "method:N", "concurrency:Q", "measured:Q", "predicted:Q"],
        )
    )
    top = max(
        (max(p.measured_output_tokens_per_s, p.predicted_output_tokens_per_s or 0.0)
         for p in points),
        default=1.0,
    )  # fmt: skip
    diagonal = (
        _chart([{"measured": 0.0, "predicted": 0.0}, {"measured": top, "predicted": top}])
        .mark_line(color="#999999", strokeDash=[4, 4])
        .encode(x="measured:Q", y="predicted:Q")
    )
    layered: alt.LayerChart = alt.LayerChart(layer=[diagonal, dots])
    return layered


def running_error(points: list[AccuracyPoint]) -> alt.Chart:
    """Mean absolute prediction error over the points so far, in measurement order."""
    errors = [abs(p.error) for p in points if p.error is not None]
    values = [{"point": i + 1, "error": sum(errors[: i + 1]) / (i + 1)} for i in range(len(errors))]
    y = alt.Y("error:Q", title="running mean |error|", axis=alt.Axis(format="%"))
    x = alt.X("point:Q", title="measured point", axis=alt.Axis(tickMinStep=1, format="d"))
    chart: alt.Chart = _chart(values).mark_line(point=True).encode(x=x, y=y)
    return chart


def acceptance_by_position(curves: dict[str, list[float]]) -> alt.Chart:
    """Per backend: the share of drafted tokens accepted at each speculative position."""
    values = [
        {"backend": name, "position": i + 1, "accepted": rate}
        for name, rates in curves.items()
        for i, rate in enumerate(rates)
    ]
    chart: alt.Chart = (
        _chart(values)
        .mark_line(point=True)
        .encode(
            x=alt.X("position:O", title="draft position", axis=alt.Axis(labelAngle=0)),
            y=alt.Y("accepted:Q", title="accepted", axis=alt.Axis(format="%")),
            color="backend:N",
            tooltip=["backend:N", "position:O", "accepted:Q"],
        )
    )
    return chart


def daily_trend(days: list[tuple[dt.date, float, float]]) -> alt.Chart:
    """Capacity cost and its difference from plain decoding, day by day."""
    values = [
        {"day": day.isoformat(), "figure": figure, "usd": usd}
        for day, cost, saved in days
        for figure, usd in ((CAPACITY, cost), (BELOW_PLAIN, saved))
    ]
    chart: alt.Chart = (
        _chart(values)
        .mark_line(point=True)
        .encode(
            x=alt.X("day:T", title="day (UTC)"),
            y=alt.Y("usd:Q", title="USD"),
            color="figure:N",
            tooltip=["day:T", "figure:N", "usd:Q"],
        )
    )
    return chart
