"""The Methods chart tells measured from estimated: dashes fixed per kind, whole legends."""

from __future__ import annotations

from typing import Any, Literal

from dashboard import charts
from dashboard.schemas import AccuracyPoint, PlanPoint


def point(c: int, source: Literal["measured", "estimated"]) -> PlanPoint:
    return PlanPoint(method="p-eagle", k=7, concurrency=c, output_tokens_per_s=100.0 * c,
                     itl_ms=10.0, usd_per_mtok=0.1, source=source)  # fmt: skip


def test_segments_are_measured_only_between_two_measured_points() -> None:
    curve = [point(1, "measured"), point(2, "measured"), point(4, "estimated")]
    rows = charts._segments({"p-eagle": curve})
    kinds = {r["segment"]: r["kind"] for r in rows}
    assert kinds == {"p-eagle/0": "measured", "p-eagle/1": "estimated"}
    assert [r["concurrency"] for r in rows] == [1, 2, 2, 4]  # each segment both its ends


def test_an_all_estimated_curve_is_dashed_and_legends_are_not_cut() -> None:
    curve = [point(1, "estimated"), point(2, "estimated")]
    spec: dict[str, Any] = charts.throughput_vs_concurrency({"p-eagle": curve}, [], 1).to_dict()
    line, dots = spec["layer"]
    dash = line["encoding"]["strokeDash"]
    # Estimated maps to the dash whatever kinds are present (not to the first one's solid).
    assert dash["scale"] == {"domain": ["measured", "estimated"], "range": [[1, 0], [6, 4]]}
    assert dots["encoding"]["fill"]["value"] == "white"  # hollow unless measured
    for encoding in (line["encoding"]["color"], dash):
        assert encoding["legend"]["labelLimit"] == 0
        assert encoding["legend"]["orient"] == "bottom"


def test_each_method_keeps_one_strong_colour_on_every_series_of_it() -> None:
    rows = [{"series": s} for s in ("p-eagle", "measured: p-eagle", "eagle3 K=3", "custom")]
    scale = charts._colours(rows).to_dict()
    colour = dict(zip(scale["domain"], scale["range"], strict=True))
    assert colour["p-eagle"] == colour["measured: p-eagle"] == charts.METHOD_COLOURS["p-eagle"]
    assert colour["eagle3 K=3"] == charts.METHOD_COLOURS["eagle3"]
    assert colour["custom"] == charts.OTHER_COLOUR
    assert len(set(charts.METHOD_COLOURS.values())) == len(charts.METHOD_COLOURS)


def test_the_accuracy_scatter_has_the_line_of_a_perfect_prediction() -> None:
    point = AccuracyPoint(
        model="m", gpu_type="B200", method="p-eagle", k=7, concurrency=4.0, source="scrape",
        measured_output_tokens_per_s=300.0, predicted_output_tokens_per_s=450.0, error=0.5,
    )  # fmt: skip
    diagonal, dots = charts.predicted_vs_measured([point]).to_dict()["layer"]
    assert diagonal["data"]["values"] == [
        {"measured": 0.0, "predicted": 0.0},
        {"measured": 450.0, "predicted": 450.0},
    ]
    assert dots["mark"]["type"] == "circle"
