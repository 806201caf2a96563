"""Right-sizing's pure part: traffic hours from rollup rows and held spans, without a database."""

from __future__ import annotations

import datetime as dt

import pytest

from gateway.services.sizing import hours_of_traffic, merge_spans

T0 = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
H = dt.timedelta(hours=1)
M = dt.timedelta(minutes=1)


def test_overlapping_and_touching_spans_merge_and_the_rest_stay_apart() -> None:
    spans = [
        (T0 + 3 * H, T0 + 4 * H),
        (T0, T0 + H),
        (T0 + 30 * M, T0 + 2 * H),
        (T0 + 2 * H, T0 + 150 * M),
    ]
    assert merge_spans(spans) == [(T0, T0 + 150 * M), (T0 + 3 * H, T0 + 4 * H)]
    assert merge_spans([]) == []


def test_an_hour_held_ten_minutes_has_its_tokens_over_those_ten_minutes() -> None:
    rows = [(T0, "plain", 4, 400, 600, 30.0), (T0, "ngram", 1, 100, 600, 10.0)]
    held = [(T0 + 50 * M, T0 + 2 * H)]
    [first, second] = hours_of_traffic(rows, held, T0, T0 + 2 * H, T0 + 3 * H)
    assert (first.hour, first.elapsed_s) == (T0, 600.0)
    assert first.weight == pytest.approx(1 / 6)
    assert (first.requests, first.prompt_tokens, first.completion_tokens) == (5, 500, 1200)
    assert first.busy_s == 40.0
    assert first.demand() == pytest.approx(2.0)
    assert first.completion_by_method == {"plain": 600, "ngram": 600}
    assert first.busy_s_by_method == {"plain": 30.0, "ngram": 10.0}
    # Held all hour without traffic: an hour of nothing, weighed whole.
    assert (second.hour, second.weight, second.requests, second.demand()) == (T0 + H, 1.0, 0, 0)


def test_traffic_with_no_held_span_counts_the_whole_hour_up_to_now() -> None:
    rows = [(T0, "plain", 2, 20, 360, None)]
    [hour] = hours_of_traffic(rows, [], T0, T0 + 2 * H, T0 + 30 * M)
    assert (hour.weight, hour.elapsed_s, hour.busy_s) == (0.5, 1800.0, 0.0)
    assert hour.demand() == pytest.approx(0.2)


def test_hours_outside_the_period_or_never_held_are_left_out() -> None:
    held = [(T0 - H, T0 + H)]
    assert [h.hour for h in hours_of_traffic([], held, T0, T0 + 3 * H, T0 + 4 * H)] == [T0]
