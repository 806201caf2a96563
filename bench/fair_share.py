"""What the fair-share queue costs: c=256 requests at once on a model whose backend has room
for 64 within its objective, from 500 teams, against the same load with the queue off and
with it on but the model never full.

Each request is what the relay does around a backend call for the queue
(gateway/relay/fairshare.py): `enter` (let in now, or wait its turn), the backend's work (an
`asyncio.sleep` of the service time, holding its place), then `served` and `done`. Closed
loop: each of the 256 clients sends its next request when one ends. Configurations:

- `off`: no queue (`DRAFTGATE_FAIR_SHARE=false`): all 256 on the backend at once, each
  taking 256 / 64 times the service time (the backend's batch serving them all at the rate
  it serves 64: its queue and batch, not the gateway's, hold them);
- `room`: the same with the queue on but the model without an objective (never full: the
  hot path's one comparison);
- `full`: the queue on, room for 64 of the 256 and each taking the service time: 192 wait
  in the gateway, let in by team as each ends.

All three serve about 64 / service time requests a second, so their CPU per request
compares the work around the same traffic.

Reported: the process's CPU microseconds per request (`time.process_time`), its ratio to
`off`, and, for `full`, the requests let in per second (64 / service time at most) and the
mean wait. Configurations alternate round by round; the median over rounds is shown.

Run: .venv/bin/python bench/fair_share.py [--seconds 5] [--rounds 5] [--service-ms 20]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import random
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway.metrics import GatewayMetrics
from gateway.registry import BackendState, BackendView, PolicyView, Snapshot, TeamShare
from gateway.relay.fairshare import FairShare
from planner.cost import ThroughputCurve

MODEL = "m"
CLIENTS = 256
ROOM = 64
TEAMS = 500
BACKEND = BackendView("b", "http://b", MODEL, "plain", None, "B200", 1)
CURVE = {(MODEL, "plain", "B200"): ThroughputCurve((1.0, 1024.0), (100.0, 100.0))}  # 10 ms/stream


@dataclass
class Outcome:
    cpu_us: float  # per request
    per_s: float
    wait_ms: float  # mean, of requests that waited


class Watch:
    """The bench's clients never leave."""

    def arm(self) -> None:
        pass

    def disarm(self) -> None:
        pass


def snapshot(full: bool) -> Snapshot:
    """One backend; with `full`, an objective that leaves it room for ROOM streams."""
    policies = {MODEL: PolicyView("pinned", "plain", itl_objective_ms=10.0 * ROOM + 5)}
    shares = {t: TeamShare(weight=1.0 + t % 3) for t in range(1, TEAMS + 1)}
    return Snapshot(
        backends={MODEL: (BACKEND,)},
        policies=policies if full else {},
        curves=CURVE,
        team_shares=shares,
    )


async def load(config: str, seconds: float, service_s: float, seed: int) -> Outcome:
    fair = FairShare(defaultdict(BackendState), GatewayMetrics(), 100_000, 600.0)
    snap, rng, watch = snapshot(config == "full"), random.Random(seed), Watch()
    done, waited, waits = 0, 0, 0.0
    deadline = time.monotonic() + seconds
    hold_s = service_s if config == "full" else service_s * CLIENTS / ROOM

    async def client() -> None:
        nonlocal done, waited, waits
        while time.monotonic() < deadline:
            team, prompt = -rng.randint(1, TEAMS), rng.choice((20, 200, 8000))
            if config == "off":
                await asyncio.sleep(hold_s)
            else:
                asked = time.monotonic()
                tokens = functools.partial(int, prompt)  # the prompt estimate, as the relay asks it
                ticket = await fair.enter(snap, MODEL, team, 0, tokens, watch)
                if ticket.share is not None and (wait := time.monotonic() - asked) > 1e-3:
                    waited, waits = waited + 1, waits + wait
                await asyncio.sleep(hold_s)
                ticket.served(prompt, 64)
                ticket.done()
            done += 1

    cpu, wall = time.process_time(), time.monotonic()
    await asyncio.gather(*(client() for _ in range(CLIENTS)))
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    return Outcome(cpu / done * 1e6, done / wall, waits / waited * 1000 if waited else 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--service-ms", type=float, default=20.0)
    args = parser.parse_args()
    print(
        f"$ .venv/bin/python bench/fair_share.py --seconds {args.seconds:g} "
        f"--rounds {args.rounds} --service-ms {args.service_ms:g}"
    )
    configs = ("off", "room", "full")
    outcomes: dict[str, list[Outcome]] = {c: [] for c in configs}
    for round_ in range(args.rounds):
        order = configs[round_ % 3 :] + configs[: round_ % 3]
        for config in order:
            outcome = asyncio.run(load(config, args.seconds, args.service_ms / 1000, round_))
            outcomes[config].append(outcome)
    base = statistics.median(o.cpu_us for o in outcomes["off"])
    print(f"c={CLIENTS}, {TEAMS} teams, room {ROOM} when full, {args.service_ms:g} ms a request")
    print(f"{'config':<6} {'CPU us/req':>10} {'x off':>6} {'req/s':>8} {'mean wait ms':>12}")
    for config, samples in outcomes.items():
        cpu = statistics.median(o.cpu_us for o in samples)
        per_s = statistics.median(o.per_s for o in samples)
        wait = statistics.median(o.wait_ms for o in samples)
        print(f"{config:<6} {cpu:>10.1f} {cpu / base:>6.2f} {per_s:>8.0f} {wait:>12.1f}")


if __name__ == "__main__":
    main()
