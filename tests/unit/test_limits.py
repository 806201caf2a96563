"""Per-key limits, checked from memory."""

from __future__ import annotations

from sqlalchemy.orm import sessionmaker

from gateway.limits import Limiter
from gateway.registry import KeyView

NOW = 1_800_000_000.0  # a whole minute
KEY = KeyView(7, "k", 3, 100, 1.0, "monthly", None)


def limiter() -> Limiter:
    return Limiter(sessionmaker(), sync_s=1.0)  # no database needed to check


def test_requests_per_minute() -> None:
    lim = limiter()
    for _ in range(3):
        assert lim.check(KEY, 0.0, NOW) is None
        lim.count_request(KEY.id, NOW)
    refusal = lim.check(KEY, 0.0, NOW + 15)
    assert refusal is not None
    assert (refusal.status_code, refusal.retry_after_s) == (429, 45)
    assert refusal.code == "rate_limit_exceeded"
    assert lim.check(KEY, 0.0, NOW + 60) is None  # a new minute


def test_tokens_per_minute_and_budget() -> None:
    lim = limiter()
    lim.count_usage(KEY.id, 150, 0.25)
    # count_usage uses the wall clock's minute; check in the same minute
    import time

    refusal = lim.check(KEY, 0.0, time.time())
    assert refusal is not None
    assert "tokens per minute" in refusal.message
    spent = lim.check(KeyView(7, "k", None, None, 1.0, "monthly", None), 0.8, time.time())
    assert spent is not None
    assert spent.code == "insufficient_quota"  # 0.8 in the snapshot + 0.25 since
    lim.snapshot_loaded()  # the snapshot now includes the 0.25
    assert lim.check(KeyView(7, "k", None, None, 1.0, "monthly", None), 0.8, time.time()) is None


def test_unlimited_key_is_never_refused() -> None:
    lim = limiter()
    free = KeyView(1, "free", None, None, None, "monthly", None)
    for _ in range(100):
        lim.count_request(free.id, NOW)
    assert lim.check(free, 1e9, NOW) is None
