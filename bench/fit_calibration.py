"""Fit the engine coefficients of planner/data/calibration.yaml to the published figures.

Run: .venv/bin/python bench/fit_calibration.py [--gpt-oss]
Prints each engine's fitted `engines` entry (paste it into the data file) and the
residuals: vLLM's MoE and collective terms fitted to the DeepSeek-V4-Pro sweep (reference
5.8) with the GPT-OSS-20B figures kept in view, SGLang's every coefficient to the
Qwen3.5-27B and Qwen3.6-35B-A3B sweeps (5.6, 5.7). --gpt-oss refits vLLM's other
coefficients to the GPT-OSS-20B figures alone first (how they were made).
"""

from __future__ import annotations

import math
import sys

from planner import calibration, sweeps
from planner.calibrate import (
    NAMES,
    SWEEP_SECTIONS,
    SWEEP_TERMS,
    fit_engine,
    fit_engine_to_sweeps,
    residuals,
)


def main(argv: list[str]) -> int:
    print("# command: .venv/bin/python bench/fit_calibration.py " + " ".join(argv))
    if "--gpt-oss" in argv:
        gpt_oss_terms = [n for n in NAMES if n not in SWEEP_TERMS["vllm"]]  # as they were
        fitted, best = fit_engine(calibration.engine_calibration(), free=gpt_oss_terms)
        print(f"# GPT-OSS-20B figures alone: objective {best:.4f}")
        for name in NAMES:
            print(f"    {name}: {getattr(fitted, name):.6g}")
    for engine in SWEEP_SECTIONS:
        fitted, best = fit_engine_to_sweeps(engine)
        print(f"\n# objective {best:.4f}")
        print(f"  - name: {engine}")
        for name in NAMES:
            print(f"    {name}: {getattr(fitted, name):.6g}")
        points = [p for p in calibration.sweep_points() if p.section in SWEEP_SECTIONS[engine]]
        for section in SWEEP_SECTIONS[engine]:
            rows = sweeps.modelled(fitted, [p for p in points if p.section == section])
            mape = sum(abs(math.exp(r.log_error) - 1) for r in rows) / len(rows)
            print(f"# {section}: throughput MAPE {mape:.1%} over {len(rows)} points")
        if engine == "vllm":
            for label, _, error in residuals(fitted):
                print(f"# {label:28s} {math.exp(error):6.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
