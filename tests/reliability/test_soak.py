"""A short soak: 64 streaming clients for 30 s through the gateway, by bench/soak.py.

The full run (256 clients, 10 minutes) is `bench/soak.py` with its defaults.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONCURRENCY = 64
DURATION_S = 30
RSS_LIMIT_MB = 300.0
# After warm-up: measured 1-2 MB over 40 s at 400-800 requests/s; 35-110 MB while SQLite's
# statement cache filled with the ledger's inserts (gateway/db/session.py).
RSS_GROWTH_LIMIT_MB = 20.0
RUN_TIMEOUT_S = 300


def test_short_soak_has_no_errors_and_flat_memory() -> None:
    """No failed request, every request in the ledger, RSS under 300 MB and not growing."""
    command = [
        sys.executable,
        str(REPO / "bench" / "soak.py"),
        "--concurrency", str(CONCURRENCY),
        "--duration", str(DURATION_S),
        "--report-interval", "10",
        "--json",
    ]  # fmt: skip
    run = subprocess.run(
        command, cwd=REPO, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False
    )
    print(run.stdout)
    assert run.stdout.strip(), run.stderr[-3000:]
    figures = json.loads(run.stdout.strip().splitlines()[-1])
    assert figures["requests"] > CONCURRENCY
    assert figures["errors"] == 0, figures["first_errors"]
    assert figures["records"] == figures["requests"]
    assert all(n > 0 for n in figures["per_interval"]), figures["per_interval"]
    assert figures["rss_max_mb"] < RSS_LIMIT_MB
    assert figures["rss_end_mb"] < RSS_LIMIT_MB
    assert run.returncode == 0, run.stderr[-3000:]
    growth = figures["rss_end_mb"] - figures["rss_warm_mb"]
    assert growth < RSS_GROWTH_LIMIT_MB, (growth, figures["rss_per_interval_mb"])
