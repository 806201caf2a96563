"""A drafter's own curve where two drafters of a method serve side by side."""

from __future__ import annotations

import pytest

from gateway.curves import CurveKey, Curves, Sample, Served, Variant, build_curves, pool
from gateway.drafters import DrafterCurve, DrafterKey, drafter_curves, drafter_factor

MODEL, GPU = "openai/gpt-oss-20b", "B200"
KEY = (MODEL, "p-eagle", GPU)
Live = dict[CurveKey, set[Variant]]


def _curves(samples: list[Sample], live: Live) -> tuple[Curves, dict[DrafterKey, DrafterCurve]]:
    points, _ = pool(samples, live)
    curves = build_curves(points, [Served(MODEL, "p-eagle", 7, GPU)])
    return curves, drafter_curves(samples, live, curves.k)


def _windows(drafter: str, c: float, rate: float) -> list[Sample]:
    """Three windows at c, +-2% around `rate` tokens/s."""
    return [Sample(KEY, 7, c, rate * f, 3.8, 100, 256, drafter=drafter) for f in (0.98, 1.0, 1.02)]


def test_each_drafter_is_priced_on_its_own_curve_at_the_requests_load() -> None:
    """Both drafters measured at c=4 and c=16, the new one 25% faster at both: the method's
    pooled line runs between them; at either load old pays 1.125x the line's price per
    token and new 0.9x, each known to within its own windows' interval."""
    old = [*_windows("old", 4.0, 1000.0), *_windows("old", 16.0, 3000.0)]
    new = [*_windows("new", 4.0, 1250.0), *_windows("new", 16.0, 3750.0)]
    live: Live = {KEY: {("old", None), ("new", None)}}
    curves, drafters = _curves([*old, *new], live)
    line = curves.lines[KEY]
    assert [line.at(4), line.at(16)] == pytest.approx([1125.0, 3375.0])
    for c in (4.0, 16.0):
        assert drafter_factor(line, drafters[(*KEY, "old")], c) == pytest.approx(1.125)
        assert drafter_factor(line, drafters[(*KEY, "new")], c) == pytest.approx(0.9)
    # each drafter's own windows: 1.96 x their 1.6% spread / sqrt(3), about 1.8%
    new_band = drafters[(*KEY, "new")].band
    assert 0.01 < new_band.relative_95(4.0) < 0.03
    assert new_band.source(4.0) == "measured"
    assert [p.points for p in drafters[(*KEY, "new")].measured] == [3, 3]


def test_one_drafter_or_a_window_of_another_version_draws_no_curve_apart() -> None:
    old = _windows("old", 4.0, 1000.0)
    new = [Sample(KEY, 7, 4.0, 1250.0, 4.1, 100, 256, drafter="new", engine_version="0.31.0")]
    _, alone = _curves([*old, *new], {KEY: {("old", None)}})
    assert alone == {}
    # the new drafter's only window is of an engine no backend runs now: no curve of its own
    _, drafters = _curves([*old, *new], {KEY: {("old", "0.32.0"), ("new", "0.32.0")}})
    assert set(drafters) == {(*KEY, "old")}
