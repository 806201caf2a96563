"""Time the held-out fit behind `GET /admin/v1/plan` and `/admin/v1/accuracy` as a
collector's measurements pile up: one point per backend per window, at a few loads.

Run: .venv/bin/python bench/planner_fit.py [--windows 20,60,600,3000]
Compares, in one run, the fit on pooled points with held-out folds against leave-one-out
over every stored point (what it replaced), which is timed only while it stays under a
minute and otherwise projected from its last timing (it grows with the square of points).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Sequence

from planner import calibration, catalog
from planner.fit_measurements import (
    Hardware,
    MeasuredPoint,
    fit_calibration,
    held_out_predictions,
    predict_point,
)

HW = Hardware(
    catalog.model("openai/gpt-oss-20b"), catalog.gpu("B200"), 1, calibration.workloads()["chat"]
)
METHODS = (("plain", 0), ("eagle3", 3), ("p-eagle", 7), ("dflash", 7), ("dspark", 7))
OLD_BUDGET_S = 60.0


def windows(count: int, rng: random.Random) -> list[MeasuredPoint]:
    """`count` scrape windows: a method each, at a drifting load, 5 % noise."""
    cal = calibration.engine_calibration()
    out = []
    for i in range(count):
        method, k = METHODS[i % len(METHODS)]
        c = rng.choice((1.2, 2.5, 3.1, 6.0, 11.0, 24.0, 48.0))
        exact = predict_point(HW, cal, MeasuredPoint(method, k, c, 1.0))
        out.append(MeasuredPoint(method, k, c, exact * rng.uniform(0.95, 1.05)))
    return out


def leave_one_out_unpooled(points: Sequence[MeasuredPoint]) -> list[float]:
    """The previous algorithm: one fit per point, over every other point."""
    base = calibration.engine_calibration()
    return [
        predict_point(HW, fit_calibration(HW, base, [q for q in points if q is not p]), p)
        for p in points
    ]


def timed(run: object, *args: object) -> float:
    start = time.perf_counter()
    run(*args)  # type: ignore[operator]
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--windows", default="20,60,600,3000")
    counts = [int(n) for n in parser.parse_args().windows.split(",")]
    rng = random.Random(7)
    print(f"command: {' '.join(sys.argv)}")
    print(f"{'windows':>8} {'pooled folds s':>15} {'leave-one-out s':>16} {'ratio':>8}")
    old_s, old_n = None, 0
    for n in counts:
        points = windows(n, rng)
        new_s = timed(held_out_predictions, HW, points)
        if old_s is None or old_s * (n / old_n) ** 2 < OLD_BUDGET_S:
            old_s, old_n, mark = timed(leave_one_out_unpooled, points), n, ""
            old_at_n = old_s
        else:
            old_at_n, mark = old_s * (n / old_n) ** 2, " (projected)"
        print(f"{n:>8} {new_s:>15.2f} {old_at_n:>16.1f} {old_at_n / new_s:>7.0f}x{mark}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
