"""Backends SIGKILLed and restarted under streaming load for minutes: what clients and ledger saw.

Starts two simulators of one model and `draftgate gateway` in front of them (on a fresh
PostgreSQL schema, or SQLite), runs `--concurrency` streaming clients for `--duration`
seconds, and every `--kill-every` seconds SIGKILLs one backend (alternating), keeps it down
for `--down-s`, and restarts it on the same port. Prints per kill how long the gateway took
to take the backend out and to put it back, then the totals: requests sent, failed (never
streamed), retried, broken streams with an SSE error event, silently truncated streams, and
usage records expected and found (exactly one per request). The short version is
tests/reliability/test_backend_failure.py.

    .venv/bin/python bench/reliability_failover.py [--duration 120] [--concurrency 64]
        [--kill-every 20] [--down-s 5] [--database postgres|sqlite]
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.conftest import POSTGRES_URL
from tests.reliability.conftest import (
    Processes,
    Server,
    fleet_backend,
    metric_value,
    run_streaming_load,
    usage_counts,
)

MODEL = "bench/failover"
PREFIX = "bench-failover"


@dataclass
class Kill:
    """One kill and restart of a backend, as the gateway saw it."""

    backend: str
    out_after_s: float
    back_after_s: float


def parse_args() -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of load")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--kill-every", type=float, default=20.0, help="seconds between kills")
    parser.add_argument("--down-s", type=float, default=5.0, help="seconds a backend stays down")
    parser.add_argument("--probe-interval", type=float, default=1.0)
    parser.add_argument("--time-scale", type=float, default=0.2, help="simulator speed")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--database", choices=["postgres", "sqlite"], default="postgres")
    return parser.parse_args()


@contextmanager
def database(kind: str, tmp: Path) -> Iterator[str]:
    """A fresh database URL: a new PostgreSQL schema (dropped after) or a SQLite file."""
    if kind == "sqlite":
        yield f"sqlite:///{tmp}/failover.db"
        return
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield f"{POSTGRES_URL}?options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


async def wait_gauge(gateway: Server, backend: str, value: int, timeout_s: float = 60.0) -> float:
    """Seconds until the gateway's healthy gauge of `backend` reads `value`."""
    started = time.monotonic()
    while True:
        seen = await asyncio.to_thread(
            metric_value, gateway.base_url, "draftgate_backend_healthy", backend=backend
        )
        if seen == value or time.monotonic() - started > timeout_s:
            return time.monotonic() - started
        await asyncio.sleep(0.05)


async def chaos(
    args: argparse.Namespace, processes: Processes, gateway: Server, sims: dict[str, Server]
) -> list[Kill]:
    """Kill and restart the backends in turn until the load ends."""
    kills: list[Kill] = []
    deadline = time.monotonic() + args.duration - args.down_s - 5
    names = sorted(sims)
    while time.monotonic() + args.kill_every < deadline:
        await asyncio.sleep(args.kill_every)
        name = names[len(kills) % len(names)]
        sims[name].process.kill()
        out_s = await wait_gauge(gateway, name, 0)
        await asyncio.sleep(max(args.down_s - out_s, 0))
        options = ("--time-scale", str(args.time_scale))
        restart = asyncio.to_thread(processes.sim, *options, model=MODEL, port=sims[name].port)
        sims[name] = await restart
        restarted = time.monotonic()
        await wait_gauge(gateway, name, 1)
        kills.append(Kill(name, out_s, time.monotonic() - restarted))
    return kills


async def run(args: argparse.Namespace, tmp: Path, url: str) -> None:
    """Start everything, run load and kills, print the figures."""
    processes = Processes(tmp)
    try:
        options = ("--time-scale", str(args.time_scale))
        sims = {f"bench-{i}": processes.sim(*options, model=MODEL) for i in range(2)}
        fleet = [fleet_backend(n, s.base_url, model=MODEL) for n, s in sims.items()]
        gateway = processes.gateway(
            url,
            fleet,
            PROBE_INTERVAL_S=str(args.probe_interval),
            BREAKER_COOLDOWN_S="2",
            COLLECT_INTERVAL_S="3600",  # pure in-flight balancing, no scraped queue lengths
        )
        load = run_streaming_load(
            gateway.base_url,
            MODEL,
            concurrency=args.concurrency,
            duration_s=args.duration,
            max_tokens=args.max_tokens,
            prefix=PREFIX,
        )
        result, kills = await asyncio.gather(load, chaos(args, processes, gateway, sims))
        retried = metric_value(gateway.base_url, "draftgate_upstream_retries_total", model=MODEL)
    finally:
        for server in processes.started:  # the gateway flushes its ledger as it stops
            server.close()
    sent = set(result.request_ids)
    for outcome in [o for o in result.outcomes if o.kind in ("failed", "truncated")][:5]:
        print(f"  {outcome.kind}: {outcome}")
    report(args, result.summary(), retried, kills, sent, await asyncio.to_thread(ledger, url, sent))


def ledger(database_url: str, sent: set[str]) -> dict[str, int]:
    """Usage records per request id once all of `sent` are there (or 30 s passed)."""
    deadline = time.monotonic() + 30
    while not sent <= set(counts := usage_counts(database_url, PREFIX)):
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)
    return counts


def report(
    args: argparse.Namespace,
    summary: str,
    retried: float,
    kills: list[Kill],
    sent: set[str],
    counts: dict[str, int],
) -> None:
    """Print the figures and the command that produced them."""
    for kill in kills:
        print(
            f"kill {kill.backend}: taken out after {kill.out_after_s:.2f}s "
            f"(probe interval {args.probe_interval}s), back {kill.back_after_s:.2f}s after restart"
        )
    missing = len(sent - set(counts))
    duplicated = sum(1 for c in counts.values() if c > 1)
    print(f"c={args.concurrency} for {args.duration:.0f}s, {len(kills)} kills, {args.database}:")
    print(f"  {summary} retried={retried:.0f}")
    print(
        f"  ledger: records expected={len(sent)} found={sum(counts.values())} "
        f"missing={missing} duplicated={duplicated}"
    )
    print("command: .venv/bin/python " + shlex.join(sys.argv))


def main() -> None:
    """Run the benchmark."""
    args = parse_args()
    with tempfile.TemporaryDirectory() as tmp, database(args.database, Path(tmp)) as url:
        asyncio.run(run(args, Path(tmp), url))


if __name__ == "__main__":
    main()
