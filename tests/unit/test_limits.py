"""Per-key limits, checked from memory: reservations at admission, settled at the end."""

from __future__ import annotations

import time

import pytest
from sqlalchemy.orm import sessionmaker

from gateway.errors import QuotaExceeded, RateLimited
from gateway.limits import Limiter
from gateway.registry import KeyView, Snapshot
from gateway.relay.checks import worst_case_tokens

NOW = 1_800_000_000.0  # a whole minute
KEY = KeyView(7, "k", 3, 100, 1.0, "monthly", None)
BUDGET = KeyView(7, "k", None, None, 1.0, "monthly", None)


def limiter() -> Limiter:
    return Limiter(sessionmaker(), sync_s=1.0)  # no database needed to check


def test_requests_per_minute() -> None:
    lim = limiter()
    for _ in range(3):
        lim.admit(KEY, 0.0, 0, 0.0, NOW)
    with pytest.raises(RateLimited) as refused:
        lim.admit(KEY, 0.0, 0, 0.0, NOW + 15)
    assert (refused.value.status_code, refused.value.retry_after_s) == (429, 45)
    assert refused.value.code == "rate_limit_exceeded"
    lim.admit(KEY, 0.0, 0, 0.0, NOW + 60)  # a new minute
    assert lim.remaining(KEY, NOW + 60) == (2, 100)


def test_requests_in_flight_are_bounded_until_settled() -> None:
    lim = limiter()
    two = KeyView(7, "k", None, None, None, "monthly", None, max_concurrent_requests=2)
    held = [lim.admit(two, 0.0, 0, 0.0) for _ in range(2)]
    with pytest.raises(RateLimited) as refused:
        lim.admit(two, 0.0, 0, 0.0)
    assert (refused.value.status_code, refused.value.code) == (429, "concurrency_limit_exceeded")
    assert refused.value.retry_after_s == 1
    lim.settle(held[0], 0, None)
    held[0] = lim.admit(two, 0.0, 0, 0.0)  # a slot came free
    other = KeyView(8, "other", None, None, None, "monthly", None, max_concurrent_requests=1)
    lim.admit(other, 0.0, 0, 0.0)  # keys are counted apart
    unlimited = KeyView(7, "k", None, None, None, "monthly", None)  # the limit lifted
    lim.admit(unlimited, 0.0, 0, 0.0)


def test_tokens_are_reserved_at_admission_and_settled_to_the_actual() -> None:
    lim = limiter()
    now = time.time()  # settling reads the wall clock's minute
    held = lim.admit(KEY, 0.0, 60, 0.0, now)
    assert lim.remaining(KEY, now) == (2, 40)
    with pytest.raises(RateLimited) as refused:  # 60 reserved + 60 > 100, while in flight
        lim.admit(KEY, 0.0, 60, 0.0, now)
    assert refused.value.retry_after_s is not None
    lim.settle(held, 25, None)  # it used 25 of its 60
    assert lim.remaining(KEY, now) == (2, 75)
    lim.admit(KEY, 0.0, 60, 0.0, now)


def test_a_request_larger_than_the_limit_is_refused_for_good() -> None:
    with pytest.raises(RateLimited) as refused:
        limiter().admit(KEY, 0.0, 101, 0.0, NOW)
    assert refused.value.retry_after_s is None  # waiting never helps
    assert refused.value.param == "max_tokens"
    assert "Request too large" in refused.value.message


def test_budget_holds_the_worst_case_of_requests_in_flight() -> None:
    lim = limiter()
    held = [lim.admit(BUDGET, 0.5, 0, 0.2) for _ in range(2)]  # 0.5 + 2 x 0.2 held
    with pytest.raises(QuotaExceeded) as refused:
        lim.admit(BUDGET, 0.5, 0, 0.2)  # 0.5 + 0.4 + 0.2 > 1.0
    assert refused.value.code == "insufficient_quota"
    lim.settle(held[0], 10, 0.05)  # cost less than its worst case: room again
    lim.admit(BUDGET, 0.5, 0, 0.2)
    lim.settle(held[1], 10, None)  # failed: released, nothing spent
    lim.snapshot_loaded(Snapshot())  # the snapshot now includes the 0.05
    lim.admit(BUDGET, 0.55, 0, 0.2)


def test_spend_since_the_snapshot_counts_until_the_snapshot_has_it() -> None:
    lim = limiter()
    lim.settle(lim.admit(BUDGET, 0.0, 0, 0.0), 150, 0.25)
    with pytest.raises(QuotaExceeded):
        lim.admit(BUDGET, 0.8, 0, 0.0)  # 0.8 in the snapshot + 0.25 since
    lim.snapshot_loaded(Snapshot())
    lim.admit(BUDGET, 0.8, 0, 0.0)


def test_unlimited_key_is_never_refused() -> None:
    lim = limiter()
    free = KeyView(1, "free", None, None, None, "monthly", None)
    for _ in range(100):
        lim.admit(free, 1e9, 10**6, 1e6, NOW)
    assert lim.remaining(free, NOW) == (None, None)


@pytest.mark.parametrize(
    ("path", "payload", "expected"),
    [
        ("/v1/chat/completions", {"max_tokens": 50}, 10 + 50),
        ("/v1/chat/completions", {"max_completion_tokens": 30, "max_tokens": 50}, 10 + 30),
        ("/v1/chat/completions", {"max_tokens": 50, "n": 3}, 10 + 150),
        ("/v1/chat/completions", {}, 10 + 1000),  # no max: the model's limit
        ("/v1/chat/completions", {"max_tokens": 5000}, 10 + 1000),  # never past the limit
        ("/v1/completions", {}, 10 + 16),  # vLLM's default for completions
        ("/v1/responses", {"max_output_tokens": 40}, 10 + 40),
        ("/v1/embeddings", {}, 10),  # the prompt only
        ("/v1/chat/completions", {"max_tokens": True, "n": "2"}, 10 + 1000),  # not counts
    ],
)
def test_worst_case_tokens(path: str, payload: dict[str, object], expected: int) -> None:
    assert worst_case_tokens(path, payload, body_bytes=40, limit=1000) == expected


def test_budget_use_is_the_snapshots_spend_and_what_was_served_since() -> None:
    """What `draftgate_key_budget_used_ratio` shows: reservations are not spend; keys
    without a budget are left out."""
    lim = limiter()
    free = KeyView(8, "free", None, None, None, "monthly", None)
    snapshot = Snapshot(keys={"h7": BUDGET, "h8": free}, key_spend_usd={7: 0.5})
    assert lim.budget_used(snapshot) == {("7", "k"): 0.5}
    held = lim.admit(BUDGET, 0.5, 0, 0.1, NOW)
    assert lim.budget_used(snapshot) == {("7", "k"): 0.5}
    lim.settle(held, 0, 0.3)
    assert lim.budget_used(snapshot) == {("7", "k"): pytest.approx(0.8)}


def test_a_teams_budget_use_is_its_keys_spend_together_under_its_own_id() -> None:
    """What `draftgate_team_budget_used_ratio` shows, named by team id when names are kept
    off /metrics."""
    lim = limiter()
    team = KeyView(-3, "search", None, None, 2.0, "monthly", None)  # team 3's subject id
    snapshot = Snapshot(keys={"h7": BUDGET}, teams={3: team}, key_spend_usd={7: 0.5, -3: 0.5})
    assert lim.budget_used(snapshot, teams=True) == {("3", "search"): 0.25}
    held = lim.admit(team, 0.5, 0, 0.1, NOW)
    lim.settle(held, 0, 0.5)
    assert lim.budget_used(snapshot, named=False, teams=True) == {("3", "team 3"): 0.5}
    assert lim.budget_used(snapshot) == {("7", "k"): 0.5}  # the key's own, apart


def test_a_small_budget_is_named_to_the_cent_fraction() -> None:
    """A $0.004 budget read "of $0.00" before."""
    small = KeyView(8, "small", None, None, 0.004, "daily", None)
    with pytest.raises(QuotaExceeded) as refused:
        limiter().admit(small, 0.003, 0, 0.002)
    assert "of $0.0040 (daily)" in refused.value.message


def test_a_released_admission_counts_for_nothing() -> None:
    """A request its team refused after its key admitted it: the key's minute, tokens and
    budget are as if it had never come."""
    lim = limiter()
    now = time.time()  # settling reads the wall clock's minute
    one = KeyView(7, "k", 1, 100, 1.0, "monthly", None)
    lim.release(lim.admit(one, 0.0, 60, 0.9, now))
    assert lim.remaining(one, now) == (1, 100)
    lim.admit(one, 0.0, 60, 0.9, now)  # its one request, its tokens and its dollar
