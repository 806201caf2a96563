"""The logs' summary lines: the gateway's access line and the simulator's vLLM-shaped stats."""

from __future__ import annotations

import datetime as dt
import re

from backends.sim.statlog import StatTally
from gateway.access_log import AccessSummary
from gateway.ledger_entry import UsageEntry


def _entry(outcome: str, method: str | None, tokens: int, latency_ms: float) -> UsageEntry:
    return UsageEntry(
        request_id="r", client_request_id=None, created_at=dt.datetime.now(dt.UTC),
        api_key_id=None, model="m", method=method, backend_name=None, prompt_tokens=5,
        completion_tokens=tokens, status_code=200 if outcome == "ok" else 400,
        outcome=outcome, latency_ms=latency_ms, ttft_ms=None, concurrency=None,
        cost_usd=0.25 if outcome == "ok" else None, baseline_cost_usd=None,
    )  # fmt: skip


def test_the_access_line_sums_its_interval_and_then_starts_again() -> None:
    summary = AccessSummary(interval_s=60)
    start = summary._since
    summary.add([_entry("ok", "p-eagle", 100, float(ms)) for ms in range(1, 20)])
    summary.add([_entry("client_error", None, 0, 500.0)])
    assert summary.line(start + 30) is None  # not due yet
    line = summary.line(start + 61)
    assert line is not None
    assert line.startswith("20 requests in 61 s (ok 19, client_error 1); by method: p-eagle 19")
    assert "1900 output tokens" in line
    assert re.search(r"latency p50 11 ms, p95 19 ms", line), line
    assert "capacity cost $4.7500" in line  # 19 x $0.25
    assert summary.line(start + 200) is None  # nothing since: no line


def test_the_stats_lines_read_like_vllms() -> None:
    tally = StatTally()
    assert tally.lines(10.0, 0, 0, 0.0) == []  # an idle engine says nothing
    tally.add_step(prompt=200, generated=1000)
    tally.add_drafts(drafts=100, draft_tokens=300, accepted_per_pos=[80, 60, 40])
    engine, spec = tally.lines(10.0, running=4, waiting=1, kv_usage=0.125)
    assert engine == (
        "Engine 000: Avg prompt throughput: 20.0 tokens/s, Avg generation throughput: "
        "100.0 tokens/s, Running: 4 reqs, Waiting: 1 reqs, GPU KV cache usage: 12.5%"
    )
    assert spec.startswith("SpecDecoding metrics: Mean acceptance length: 2.80, ")
    assert "Accepted: 180 tokens, Drafted: 300 tokens" in spec
    assert "Per-position acceptance rate: 0.800, 0.600, 0.400" in spec
    assert spec.endswith("Avg Draft acceptance rate: 60.0%")
