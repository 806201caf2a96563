"""Counter deltas into load and performance, as vLLM defines them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from backends.vllm_metrics import VllmSnapshot, difference, parse_metrics
from gateway.control.collector import Gate, Tally, method_mismatch
from gateway.registry import BackendView

BEFORE = VllmSnapshot(1000, 50, 4, 0, 0.1, 100, 700, 250, (90, 70, 50, 25, 10, 5, 0))
AFTER = VllmSnapshot(1600, 80, 8, 2, 0.3, 300, 2100, 850, (280, 230, 170, 100, 50, 20, 0))
PEAGLE = BackendView("p", "http://p", "m", "p-eagle", 7, "B200", 1)
PLAIN = BackendView("q", "http://q", "m", "plain", None, "B200", 1)


def test_difference_and_vllms_formulas() -> None:
    o = difference(BEFORE, AFTER, 2.0)
    assert o is not None
    assert (o.output_tokens, o.drafts, o.accepted, o.running) == (600, 200, 600, 8)
    tally = Tally()
    tally.add(o)
    m = tally.measurement(PEAGLE)
    assert m.output_tokens_per_s == 300  # 600 tokens over 2 s
    assert m.mean_acceptance_length == 4.0  # 1 + 600 accepted / 200 drafts
    assert m.acceptance_per_position == pytest.approx([0.95, 0.8, 0.6, 0.375, 0.2, 0.075, 0.0])
    assert (m.source, m.method, m.k, m.concurrency) == ("scrape", "p-eagle", 7, 8)


def test_a_restart_is_skipped_not_a_negative_rate() -> None:
    restarted = replace(AFTER, generation_tokens=10, drafts=3, accepted_tokens=1)
    assert difference(AFTER, restarted, 2.0) is None
    only_spec_reset = replace(AFTER, drafts=50)
    assert difference(AFTER, only_spec_reset, 2.0) is None
    assert difference(BEFORE, AFTER, 0.0) is None


def test_windows_weight_concurrency_by_time() -> None:
    tally = Tally()
    for running, seconds in ((2, 1.0), (6, 3.0)):
        tally.add(difference(BEFORE, replace(AFTER, running=running), seconds))  # type: ignore[arg-type]
    assert tally.measurement(PEAGLE).concurrency == 5.0  # (2*1 + 6*3) / 4


def test_declared_method_is_checked_against_the_counters() -> None:
    plain_page = replace(
        AFTER, drafts=None, draft_tokens=None, accepted_tokens=None, accepted_per_position=None
    )
    assert method_mismatch(PEAGLE, AFTER) is None
    assert method_mismatch(PLAIN, plain_page) is None
    assert "declared plain" in (method_mismatch(PLAIN, AFTER) or "")
    assert "declared p-eagle" in (method_mismatch(PEAGLE, plain_page) or "")


def test_parse_tolerates_the_older_kv_gauge_and_missing_families() -> None:
    page = (
        "# TYPE vllm:gpu_cache_usage_perc gauge\n"
        'vllm:gpu_cache_usage_perc{model_name="m",engine="0"} 0.25\n'
        "# TYPE vllm:generation_tokens_total counter\n"
        'vllm:generation_tokens_total{model_name="m",engine="0"} 12.0\n'
        'vllm:generation_tokens_total{model_name="m",engine="1"} 30.0\n'
    )
    snapshot = parse_metrics(page)
    assert (snapshot.kv_cache_usage, snapshot.generation_tokens) == (0.25, 42.0)
    assert snapshot.drafts is None
    assert snapshot.running == 0.0


def test_an_idle_part_of_the_window_does_not_lower_the_rate() -> None:
    tally = Tally()
    half_busy = difference(
        replace(BEFORE, e2e_latency_sum_s=10.0),
        replace(AFTER, e2e_latency_sum_s=11.0, running=0.0),
        2.0,
    )
    assert half_busy is not None
    tally.add(half_busy)
    m = tally.measurement(PLAIN)
    assert m is not None
    assert (m.concurrency, m.output_tokens_per_s) == (1.0, 600.0)  # 300 tok/s over half the time


def test_busy_time_is_summed_over_the_window_not_per_scrape() -> None:
    """A request spanning two scrapes: tokens in both, its latency only in the second."""
    tally = Tally()
    first = difference(
        replace(BEFORE, e2e_latency_sum_s=0.0),
        replace(AFTER, e2e_latency_sum_s=0.0, running=1.0),
        2.0,
    )
    tokens = AFTER.generation_tokens - BEFORE.generation_tokens
    second = difference(
        replace(AFTER, e2e_latency_sum_s=0.0),
        replace(
            AFTER,
            generation_tokens=AFTER.generation_tokens + tokens,
            e2e_latency_sum_s=2.0,
            running=0.0,
        ),
        2.0,
    )
    assert first is not None
    assert second is not None
    tally.add(first)
    tally.add(second)
    m = tally.measurement(PLAIN)
    assert m is not None
    # 2 * tokens over 4 s, busy for 2 of them: the per-request rate is tokens per second.
    assert m.concurrency == 1.0
    assert m.output_tokens_per_s == pytest.approx(2 * tokens / 2.0)


def test_a_quiet_window_with_no_finished_request_is_not_stored() -> None:
    tally = Tally()
    trickle = difference(BEFORE, replace(AFTER, running=0.0), 2.0)
    assert trickle is not None
    tally.add(trickle)
    assert tally.measurement(PLAIN) is None


def test_concurrency_comes_from_littles_law_when_latencies_are_exposed() -> None:
    before = replace(BEFORE, e2e_latency_sum_s=10.0)
    after = replace(AFTER, e2e_latency_sum_s=16.0, running=0)  # the gauge caught an idle instant
    o = difference(before, after, 2.0)
    assert o is not None
    assert o.running == 3.0  # 6 s of request latency over a 2 s interval


def test_a_thin_window_is_rejected_and_a_full_one_knows_its_sample() -> None:
    gate = Gate(min_requests=10, min_output_tokens=500)

    def window(finished: float | None, tokens: float) -> Tally:
        before = replace(BEFORE, e2e_latency_sum_s=0.0, e2e_latency_count=None)
        after = replace(
            BEFORE,
            generation_tokens=BEFORE.generation_tokens + tokens,
            prompt_tokens=BEFORE.prompt_tokens + 2000,
            e2e_latency_sum_s=4.0,
            e2e_latency_count=finished,
        )
        if finished is not None:
            before = replace(before, e2e_latency_count=0.0)
        tally = Tally()
        tally.add(difference(before, after, 2.0))  # type: ignore[arg-type]
        return tally

    assert window(3, 4000).rejection(gate) == "too_few_requests"
    assert window(10, 40).rejection(gate) == "too_few_tokens"  # ten short test requests
    assert window(None, 40).rejection(gate) == "too_few_tokens"
    assert window(None, 4000).rejection(gate) is None  # a server without the count: tokens only
    full = window(20, 4000)
    assert full.rejection(gate) is None
    m = full.measurement(PLAIN)
    assert m is not None
    assert (m.requests, m.mean_prompt_tokens, m.mean_output_tokens) == (20, 100.0, 200.0)
