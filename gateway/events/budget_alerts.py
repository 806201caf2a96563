"""Budget thresholds: a `budget.threshold` webhook the first time a key's spend in its budget
period reaches each configured fraction of its budget (`team.budget.threshold` for a team's).

Checked on every registry load, never on the hot path: the snapshot carries each budgeted
key's spend in its period, from the ledger's hourly rollups, so a crossing is seen within
one ledger flush and one `registry_refresh_s` of the request that made it. A threshold fires
once per key, period and budget however many requests and loads see it passed; it is armed
again only when the spend falls below it (a raised budget, a new period). The event's id is
made of the key, the period's start, the budget and the threshold, so every replica, and
this one after a restart, sends the same id for the same crossing.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from gateway.events.webhooks import WebhookEvent, WebhookSender, budget_threshold
from gateway.registry import Snapshot, period_start

# What a key's passed thresholds belong to: its period's start and its budget.
Marker = tuple[dt.datetime | None, float]


class BudgetWatch:
    """Remembers which thresholds each key passed; sends the newly passed ones."""

    def __init__(self, thresholds: Sequence[float], webhooks: WebhookSender) -> None:
        self.thresholds, self.webhooks = tuple(sorted(thresholds)), webhooks
        self._passed: dict[int, tuple[Marker, frozenset[float]]] = {}
        self._read_at: dt.datetime | None = None

    def load_starting(self) -> None:
        """A registry read begins: its spend is of the period holding this moment (or a
        later one, after which a fresh period's spend only looks lower)."""
        self._read_at = dt.datetime.now(dt.UTC)

    def check(self, snapshot: Snapshot) -> None:
        """Send an event per threshold passed since the last check (safe from any thread)."""
        for event in self.crossings(snapshot):
            self.webhooks.emit(event)

    def crossings(self, snapshot: Snapshot) -> list[WebhookEvent]:
        """The events of the thresholds passed since the last look (and remember them)."""
        now = self._read_at or dt.datetime.now(dt.UTC)
        events, passed = [], {}
        for key in (*snapshot.keys.values(), *snapshot.teams.values()):  # teams: ids below 0
            budget = key.budget_usd
            if not budget or budget <= 0:
                continue
            start = period_start(key.budget_period, now)
            spent = snapshot.key_spend_usd.get(key.id, 0.0)
            reached = frozenset(t for t in self.thresholds if spent >= t * budget)
            marker, before = self._passed.get(key.id, ((None, -1.0), frozenset()))
            seen = before if marker == (start, budget) else frozenset()
            events += [budget_threshold(key, start, spent, t) for t in sorted(reached - seen)]
            passed[key.id] = ((start, budget), reached)
        self._passed = passed  # keys revoked or without a budget are forgotten
        return events
