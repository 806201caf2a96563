"""Fit the engine coefficients of planner/data/calibration.yaml to the published figures.

Run: .venv/bin/python bench/fit_calibration.py
Prints the fitted `engines` entry (paste it into the data file) and the residuals.
"""

from __future__ import annotations

import math
import sys

from planner import calibration
from planner.calibrate import NAMES, fit_engine, residuals


def main() -> int:
    fitted, best = fit_engine(calibration.engine_calibration())
    print(f"# objective {best:.4f}; fitted by: python bench/fit_calibration.py")
    print("  - name: vllm")
    for name in NAMES:
        print(f"    {name}: {getattr(fitted, name):.6g}")
    print()
    for label, _, error in residuals(fitted):
        print(f"{label:28s} {math.exp(error):6.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
