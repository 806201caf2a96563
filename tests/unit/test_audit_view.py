"""Audit entries as the dashboard writes them: before → after, moves and their candidates."""

from __future__ import annotations

import datetime as dt
from typing import Any

from dashboard.audit_view import audit_rows, candidates, changes
from dashboard.schemas import AuditEntry

AT = dt.datetime(2026, 12, 3, 18, 30, 5, tzinfo=dt.UTC)


def entry(action: str, before: dict[str, Any] | None, after: dict[str, Any] | None) -> AuditEntry:
    return AuditEntry(
        id=1, at=AT, actor="admin-api", action=action, resource_type="model",
        resource_id="m", before=before, after=after,
    )  # fmt: skip


def test_an_update_shows_each_changed_field_before_and_after() -> None:
    policy = {"mode": "auto", "method": None, "k": None, "rules": [], "explore_fraction": 0.0}
    pinned = policy | {"mode": "pinned", "method": "dflash", "k": 5}
    update = entry("update", {"name": "m", "policy": policy}, {"name": "m", "policy": pinned})
    assert changes(update) == (
        "policy.mode: auto → pinned; policy.method: — → dflash; policy.k: — → 5"
    )


def test_rules_read_as_when_then_method() -> None:
    rules = [{"when": ["structured_output"], "method": "plain", "k": None},
             {"when": ["logprobs", "class:batch"], "method": "eagle3", "k": 3}]  # fmt: skip
    update = entry("update", {"policy": {"rules": []}}, {"policy": {"rules": rules}})
    assert changes(update) == (
        "policy.rules: — → (structured_output → plain), (logprobs and class:batch → eagle3 K=3)"
    )


def test_a_creation_lists_what_was_created() -> None:
    created = entry("create", None, {"name": "k1", "budget_usd": 5.0, "rules": []})
    assert changes(created) == "name: k1; budget_usd: 5.0"


def test_a_move_and_a_first_choice_read_as_sentences() -> None:
    move = entry("switch", {"method": "p-eagle"}, {"method": "plain", "concurrency": 34.2})
    assert changes(move) == "method: p-eagle → plain at 34.2 streams"
    classed = {"method": "eagle3", "concurrency": 3, "request_class": "interactive",
               "objective": "latency"}  # fmt: skip
    assert changes(entry("switch", {"method": None}, classed)) == (
        "method: — → eagle3 (class interactive, latency) at 3 streams"
    )
    start = entry("start", {"method": None}, {"method": "dflash", "concurrency": 1.0})
    assert changes(start) == "serving dflash at 1 streams (this replica's first choice)"


def test_a_gradual_move_s_step_reads_as_a_share() -> None:
    step = entry("move_step", {"method": "p-eagle"},
                 {"method": "dflash", "step": 1, "target_share": 0.25})  # fmt: skip
    assert changes(step) == "step 1: 25% of the traffic on dflash (from p-eagle)"


def test_a_move_s_candidates_cheapest_first_with_the_chosen_marked() -> None:
    after = {
        "method": "plain",
        "concurrency": 40,
        "usd_per_mtok": {"p-eagle": 0.1234, "plain": 0.05},
        "itl_ms": {"p-eagle": 12.04, "plain": 30.0},
    }
    assert candidates(entry("switch", {"method": "p-eagle"}, after)) == [
        {"method": "plain", "$ per 1M output tokens": "$0.0500", "per-token latency": "30.0 ms",
         "chosen": "yes"},
        {"method": "p-eagle", "$ per 1M output tokens": "$0.1234",
         "per-token latency": "12.0 ms", "chosen": ""},
    ]  # fmt: skip
    [row] = audit_rows([entry("switch", {"method": "p-eagle"}, after)])
    assert row == {
        "at": "2026-12-03 18:30:05 UTC",
        "by": "admin-api",
        "action": "switch",
        "change": "method: p-eagle → plain at 40 streams",
    }
