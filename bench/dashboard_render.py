"""Time every dashboard page with 1 million usage records in the database.

Run: .venv/bin/python bench/dashboard_render.py [--records 1000000] [--runs 3]

It builds a SQLite database (the demo fleet of `draftgate up`, 20 API keys, N usage records
over the last 30 days and their hourly rollups, written as the ledger writes them), starts
`draftgate gateway` on it, and runs each page in Streamlit's AppTest against that gateway:
cold (the dashboard's read cache empty) and warm (within the cache's TTL). The pages read the
rollups, never the records, so their time should not grow with the record count; the bar is
2 s per page.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import random
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
from pydantic import SecretStr
from sqlalchemy import insert
from sqlalchemy.orm import Session
from streamlit.testing.v1 import AppTest

from gateway.app import prepare_database
from gateway.cli import stack
from gateway.db.session import make_engine, make_sessionmaker, transaction
from gateway.db.tables import UsageHourly, UsageRecord
from gateway.rollups import hour_of
from gateway.schemas.resources import KeyCreate
from gateway.services.keys import create_key
from gateway.settings import Settings

TOKEN = secrets.token_urlsafe(24)
BAR_S = 2.0
BATCH = 50_000
KEYS = 20
PERIOD = dt.timedelta(days=30)
USD_PER_MTOK = {"plain": 3.8, "eagle3": 1.9, "p-eagle": 1.5, "dflash": 1.6, "dspark": 1.7}
PAGES = ("overview", "methods", "planner", "backends", "benchmarks", "keys", "accuracy")
RollupKey = tuple[dt.datetime, str, str, str, int]


def _records(
    count: int, key_ids: list[int], rollups: dict[RollupKey, list[float]]
) -> Iterator[dict[str, object]]:
    """`count` requests spread over the period, each added to its hourly rollup."""
    rng, now = random.Random(0), dt.datetime.now(dt.UTC)
    methods = list(USD_PER_MTOK)
    for i in range(count):
        method = methods[i % len(methods)]
        at = now - PERIOD * rng.random()
        key_id = key_ids[i % len(key_ids)]
        prompt, completion = rng.randint(50, 500), rng.randint(50, 1200)
        cost = completion * USD_PER_MTOK[method] / 1e6
        baseline = completion * USD_PER_MTOK["plain"] / 1e6
        total = rollups[(hour_of(at), stack.DEMO_MODEL, method, f"demo-{method}", key_id)]
        for j, value in enumerate((1, prompt, completion, cost, baseline)):
            total[j] += value
        yield {
            "request_id": f"bench-{i}",
            "created_at": at,
            "api_key_id": key_id,
            "model": stack.DEMO_MODEL,
            "method": method,
            "backend_name": f"demo-{method}",
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "status_code": 200,
            "outcome": "ok",
            "latency_ms": 800.0,
            "ttft_ms": 40.0,
            "concurrency": 8.0,
            "cost_usd": cost,
            "baseline_cost_usd": baseline,
        }


def _write_usage(session: Session, count: int, key_ids: list[int]) -> None:
    rollups: dict[RollupKey, list[float]] = defaultdict(lambda: [0.0] * 5)
    batch: list[dict[str, object]] = []
    for record in _records(count, key_ids, rollups):
        batch.append(record)
        if len(batch) == BATCH:
            session.execute(insert(UsageRecord), batch)
            batch.clear()
    if batch:
        session.execute(insert(UsageRecord), batch)
    rows = [
        {
            "hour": hour,
            "model": model,
            "method": method,
            "backend_name": backend,
            "api_key_id": key,
            "requests": int(t[0]),
            "errors": 0,
            "prompt_tokens": int(t[1]),
            "completion_tokens": int(t[2]),
            "cost_usd": t[3],
            "baseline_cost_usd": t[4],
        }
        for (hour, model, method, backend, key), t in rollups.items()
    ]
    session.execute(insert(UsageHourly), rows)


def build_database(url: str, records: int) -> None:
    """The demo fleet, keys, `records` usage records and their rollups."""
    settings = Settings(database_url=url, admin_token=SecretStr(TOKEN))
    engine = make_engine(url)
    try:
        prepare_database(settings, engine)
        with transaction(make_sessionmaker(engine)) as session:
            stack.seed_demo(session, 8101)
            keys = [
                create_key(session, KeyCreate(name=f"team-{i}", budget_usd=100.0), "bench")
                for i in range(KEYS)
            ]
            _write_usage(session, records, [k.id for k in keys])
    finally:
        engine.dispose()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def start_gateway(url: str, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRAFTGATE_")}
    env |= {
        "DRAFTGATE_DATABASE_URL": url,
        "DRAFTGATE_ADMIN_TOKEN": TOKEN,
        "DRAFTGATE_REQUIRE_API_KEY": "false",
    }
    draftgate = Path(sys.executable).parent / "draftgate"
    process = subprocess.Popen(  # noqa: S603  (our own console script)
        [str(draftgate), "gateway", "--port", str(port)],
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                return process, base
        except httpx.TransportError:
            time.sleep(0.1)
    process.terminate()
    raise SystemExit(f"the gateway did not start:\n{log.read_text()}")


def _page_script(name: str) -> None:
    import importlib

    importlib.import_module(f"dashboard.app_pages.{name}").render()


def time_page(name: str, clear: Callable[[], None]) -> tuple[float, float]:
    """Seconds of a cold run (empty read cache) and of a warm one."""
    clear()
    times = []
    for _ in range(2):
        start = time.perf_counter()
        at = AppTest.from_function(_page_script, args=(name,), default_timeout=60).run()
        times.append(time.perf_counter() - start)
        if at.exception or at.error:
            raise SystemExit(f"{name}: {[e.value for e in [*at.exception, *at.error]]}")
    return times[0], times[1]


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def measure(base_url: str, runs: int) -> dict[str, tuple[float, float]]:
    """Median cold and warm seconds per page, the dashboard pointed at `base_url`."""
    from dashboard.client import refresh_reads

    os.environ["DRAFTGATE_DASHBOARD_GATEWAY_URL"] = base_url
    os.environ["DRAFTGATE_ADMIN_TOKEN"] = TOKEN
    time_page("overview", refresh_reads)  # imports and Streamlit's own start-up, once
    results = {}
    for name in PAGES:
        cold, warm = zip(*(time_page(name, refresh_reads) for _ in range(runs)), strict=True)
        results[name] = (_median(list(cold)), _median(list(warm)))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/dashboard-bench.db"
        start = time.perf_counter()
        build_database(url, args.records)
        built_s = time.perf_counter() - start
        process, base_url = start_gateway(url, Path(tmp) / "gateway.log")
        try:
            results = measure(base_url, args.runs)
        finally:
            process.terminate()
            process.wait(timeout=30)
    print(f"command: {' '.join(sys.argv)}")
    print(f"{args.records:,} usage records over 30 days, with rollups, written in {built_s:.0f} s")
    print(f"{'page':<12}{'cold s':>8}{'warm s':>8}  under {BAR_S:g} s")
    for name, (cold, warm) in results.items():
        print(f"{name:<12}{cold:>8.2f}{warm:>8.2f}  {'yes' if cold < BAR_S else 'NO'}")
    return 0 if all(cold < BAR_S for cold, _ in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
