"""A backend's load as each replica prices it: the scraped whole, not the replica's share."""

from __future__ import annotations

import pytest

from gateway.registry import LOAD_SMOOTHING, BackendState


def test_before_any_scrape_the_load_is_our_own_in_flight() -> None:
    state = BackendState(in_flight=2)
    assert state.load() == 2.0


def test_after_scrapes_every_replica_prices_the_backends_smoothed_load() -> None:
    ours, theirs = BackendState(in_flight=1), BackendState(in_flight=8)
    for state in (ours, theirs):
        state.scraped(9.0)  # both replicas' collectors read the same backend
    assert ours.load() == theirs.load() == pytest.approx(9.0)
    for state in (ours, theirs):
        state.scraped(1.0)
    assert ours.load() == pytest.approx(9.0 - LOAD_SMOOTHING * 8.0)  # smoothed over scrapes


def test_a_request_runs_with_at_least_itself() -> None:
    state = BackendState(in_flight=1)
    state.scraped(0.0)
    assert state.load() == 1.0
    state.in_flight = 0
    assert state.load() == 0.0  # an idle backend weighs nothing
