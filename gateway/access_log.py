"""The log's access line: what the requests the ledger wrote add up to, one line per interval
with traffic (a line per request would drown the moves and warnings it stands beside, and
cost the hot path)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from typing import Protocol


class Recorded(Protocol):
    """What the line reads of a usage record (gateway/accounting.py's UsageEntry)."""

    @property
    def outcome(self) -> str: ...
    @property
    def method(self) -> str | None: ...
    @property
    def completion_tokens(self) -> int: ...
    @property
    def latency_ms(self) -> float: ...
    @property
    def cost_usd(self) -> float | None: ...


class AccessSummary:
    """The requests written since the last line, summed for the next one (every
    `interval_s`)."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._start(time.monotonic())

    def _start(self, now: float) -> None:
        self._since = now
        self._outcomes: Counter[str] = Counter()
        self._methods: Counter[str] = Counter()
        self._output_tokens = 0
        self._latencies: list[float] = []
        self._usd = 0.0

    def add(self, entries: Iterable[Recorded]) -> None:
        for e in entries:
            self._outcomes[e.outcome] += 1
            self._methods[e.method or "none"] += 1
            self._output_tokens += e.completion_tokens
            self._latencies.append(e.latency_ms)
            self._usd += e.cost_usd or 0.0

    def line(self, now: float) -> str | None:
        """The line due at `now`, if one is (and start the next interval)."""
        if now - self._since < self.interval_s or not self._latencies:
            return None
        seconds = now - self._since
        latencies = sorted(self._latencies)
        p50, p95 = latencies[len(latencies) // 2], latencies[int(0.95 * (len(latencies) - 1))]
        outcomes = ", ".join(f"{o} {n}" for o, n in self._outcomes.most_common())
        methods = ", ".join(f"{m} {n}" for m, n in self._methods.most_common())
        text = (
            f"{len(latencies)} requests in {seconds:.0f} s ({outcomes}); by method: {methods}; "
            f"{self._output_tokens} output tokens; latency p50 {p50:.0f} ms, p95 {p95:.0f} ms; "
            f"capacity cost ${self._usd:.4f}"
        )
        self._start(now)
        return text
