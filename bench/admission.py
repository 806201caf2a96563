"""What admitting a request costs as keys and teams grow: one key, 10,000 keys, and 10,000
keys in 500 teams whose limits are checked beside each key's.

Admission is what the gateway does for a request's key before it routes it, all from
memory: find the key by the SHA-256 of its secret, check its allowed models, then reserve
the request's worst-case tokens and cost against the key's (and its team's) requests per
minute, tokens per minute and budget; when the request ends, settle the reservations with
what it cost. This runs that path (gateway/relay/checks.py `authenticate`, `may_use`;
gateway/relay/exchange.py `admit`; gateway/limits.py `Limiter.settle`) in this process, on
a snapshot of the registry built here, with no server and no database, so nothing but the
path itself is timed. Every key and team has all three limits, set high enough that none
refuses. Requests draw their key at random (seeded), so 10,000 keys do not all sit in the
CPU's caches.

Configurations alternate within a round, and the report gives the median over rounds of
the microseconds per request, and its ratio to one key.

Run: .venv/bin/python bench/admission.py [--requests 50000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy.orm import sessionmaker

from gateway.apikeys import hash_key
from gateway.limits import Limiter
from gateway.metrics import GatewayMetrics
from gateway.registry import (
    BackendState,
    BackendView,
    KeyView,
    Snapshot,
    team_subject,
)
from gateway.relay.checks import authenticate, may_use
from gateway.relay.exchange import Exchange, admit

MODEL = "m"
PATH = "/v1/chat/completions"
PAYLOAD = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 64}
BODY_BYTES = 120
HIGH = 10**9  # limits no request here reaches
CONFIGS = {"1 key": (1, 0), "10000 keys": (10_000, 0), "10000 keys, 500 teams": (10_000, 500)}


def snapshot(keys: int, teams: int) -> tuple[Snapshot, list[str]]:
    """A registry snapshot of `keys` keys spread over `teams` teams (0: none); their secrets."""
    secrets = [f"sk-bench-{n:06d}" for n in range(keys)]
    views = {
        hash_key(secret): KeyView(
            n + 1,
            f"k{n}",
            HIGH,
            HIGH,
            float(HIGH),
            "monthly",
            frozenset({MODEL}),
            team_id=n % teams + 1 if teams else None,
        )
        for n, secret in enumerate(secrets)
    }
    team_views = {
        t: KeyView(team_subject(t), f"t{t}", HIGH, HIGH, float(HIGH), "monthly", None)
        for t in range(1, teams + 1)
    }
    backend = BackendView("b", "http://b", MODEL, "plain", None, "B200", 1)
    return (
        Snapshot(backends={MODEL: (backend,)}, keys=views, prices={"B200": 5.0}, teams=team_views),
        secrets,
    )


def run(keys: int, teams: int, requests: int, seed: int) -> float:
    """Microseconds per request admitted and settled."""
    snap, secrets = snapshot(keys, teams)
    limiter = Limiter(sessionmaker(), sync_s=1.0)
    metrics = GatewayMetrics()
    states: defaultdict[str, BackendState] = defaultdict(BackendState)
    rng = random.Random(seed)
    headers = [{b"authorization": f"Bearer {s}".encode()} for s in secrets]
    chosen = [headers[rng.randrange(keys)] for _ in range(requests)]
    started = time.perf_counter()
    for header in chosen:
        x = Exchange("bench")
        x.snapshot, x.model = snap, MODEL
        x.key = authenticate(header, snap, True)
        may_use(x.key, MODEL)
        admit(x, PATH, PAYLOAD, BODY_BYTES, states, 4096, limiter, metrics)
        for held in (x.reservation, x.team_reservation):
            if held is not None:
                limiter.settle(held, 80, 0.0001)
    return (time.perf_counter() - started) / requests * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(
        f"$ .venv/bin/python bench/admission.py --requests {args.requests} --rounds {args.rounds}"
    )
    times: dict[str, list[float]] = {name: [] for name in CONFIGS}
    for round_ in range(args.rounds):
        order = list(CONFIGS)[round_ % len(CONFIGS) :] + list(CONFIGS)[: round_ % len(CONFIGS)]
        for name in order:
            times[name].append(run(*CONFIGS[name], args.requests, seed=round_))
    base = statistics.median(times["1 key"])
    print(f"{'configuration':<24} {'us/request':>10} {'x 1 key':>8}   rounds (us)")
    for name, samples in times.items():
        median = statistics.median(samples)
        each = " ".join(f"{t:.2f}" for t in samples)
        print(f"{name:<24} {median:>10.2f} {median / base:>8.3f}   {each}")


if __name__ == "__main__":
    main()
