"""The committed accuracy report is current, and the planner meets its error goal."""

from __future__ import annotations

import re
from pathlib import Path

from planner.accuracy import report

ACCURACY = Path(__file__).parents[2] / "planner" / "ACCURACY.md"


def test_accuracy_report_is_current_and_under_15_percent() -> None:
    lines = report()
    assert ACCURACY.read_text().splitlines() == lines, "run `make accuracy` and commit"
    errors = [float(m) for m in re.findall(r"Mean absolute error.*?: ([\d.]+)%", "\n".join(lines))]
    assert len(errors) == 2
    assert max(errors) < 15.0
