"""Routing one request as a model's fleet grows: the chosen method's pool stays at 4
members while the model's other pools grow, side by side in one run.

Run: .venv/bin/python bench/pool_routing.py
Times `route` (gateway/relay/routing.py), the pure decision every request makes, over
20,000 calls each, for a request without a session key and one with a key (affinity):
"every pool" orders the model's whole fleet (the decision before pools, `limit=None`);
"own pool" reads the chosen pool and stops at the 3 backends a request may try
(`DRAFTGATE_MAX_ATTEMPTS`), as the relay calls it.
"""

from __future__ import annotations

import random
import sys
import time
from collections import defaultdict

from gateway.policy.affinity import Affinity, stable_hash
from gateway.registry import BackendState, BackendView, PolicyView, by_method
from gateway.relay.routing import route

CALLS = 20_000
CHOSEN = "p-eagle"
OTHERS = ("plain", "eagle3", "dflash", "dspark")
ATTEMPTS = 3


def fleet(members_elsewhere: int) -> list[BackendView]:
    """4 members of the chosen pool, and `members_elsewhere` spread over 4 other pools."""
    views = [
        BackendView(f"{CHOSEN}:10.0.0.{i}:8000", "", "m", CHOSEN, 7, "B200", 1) for i in range(4)
    ]
    for i in range(members_elsewhere):
        method = OTHERS[i % len(OTHERS)]
        name = f"{method}:10.1.{i // 250}.{i % 250}:8000"
        views.append(BackendView(name, "", "m", method, 3, "B200", 1))
    return views


def us_per_call(backends: list[BackendView], affinity: Affinity | None, own_pool: bool) -> float:
    states: defaultdict[str, BackendState] = defaultdict(BackendState)
    policy, rng = PolicyView(mode="pinned", method=CHOSEN), random.Random(0)
    pools = by_method(backends) if own_pool else None
    limit = ATTEMPTS if own_pool else None
    start = time.perf_counter()
    for _ in range(CALLS):
        route(backends, policy, None, states, 0.0, rng, None, affinity, pools=pools, limit=limit)
    return (time.perf_counter() - start) / CALLS * 1e6


def main() -> int:
    print(f"command: {' '.join(sys.argv)}")
    key = Affinity(stable_hash(b"conversation-7"), 0.25)
    print("us per routing decision (ratio: every pool / own pool)")
    print(f"{'other members':>13} {'no key: every':>14} {'own':>6} {'ratio':>6}"
          f" {'key: every':>11} {'own':>6} {'ratio':>6}")  # fmt: skip
    for others in (0, 60, 496):
        backends = fleet(others)
        row = [us_per_call(backends, a, own) for a in (None, key) for own in (False, True)]
        print(
            f"{others:>13} {row[0]:>14.1f} {row[1]:>6.1f} {row[0] / row[1]:>6.1f}"
            f" {row[2]:>11.1f} {row[3]:>6.1f} {row[2] / row[3]:>6.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
