"""Time the planner's recommendation grid: models x methods x GPUs x concurrencies (x K).

Run: .venv/bin/python bench/planner_grid.py
The catalogs hold 11 models; the grid repeats them to reach 50, as a large fleet would.
"""

from __future__ import annotations

import sys
import time

from planner import catalog
from planner.recommend import DoesNotFit, best_per_concurrency, grid

GPUS = ("B200", "H100", "H200", "A100-80GB")
CONCURRENCY = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
MODELS = 50


def main() -> int:
    names = list(catalog.models())
    fleet = [names[i % len(names)] for i in range(MODELS)]
    grid(fleet[0], GPUS[0])  # load the catalogs once
    start = time.perf_counter()
    points = 0
    for model in fleet:
        for gpu in GPUS:
            try:
                cells = grid(model, gpu, concurrency=CONCURRENCY)
            except DoesNotFit:
                continue  # too big for one GPU of this kind
            best_per_concurrency(cells, itl_objective_ms=50)
            points += len(cells)
    seconds = time.perf_counter() - start
    print(f"command: {' '.join(sys.argv)}")
    print(f"{MODELS} models x 5 methods x {len(GPUS)} GPUs x {len(CONCURRENCY)} concurrencies,")
    print(
        "each speculative method at K = 1..8 (parallel drafters also 10, 12, 15): "
        f"{points} predictions in {seconds:.2f} s "
        f"({seconds / points * 1e6:.0f} us each)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
