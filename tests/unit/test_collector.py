"""Counter deltas into load and performance, as vLLM defines them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from backends.vllm_metrics import Observation, VllmSnapshot, difference, parse_metrics
from gateway.control.collector import method_mismatch
from gateway.control.windows import Gate, Tally
from gateway.registry import BackendView, InFlightClock

BEFORE = VllmSnapshot(1000, 50, 4, 0, 0.1, 100, 700, 250, (90, 70, 50, 25, 10, 5, 0))
AFTER = VllmSnapshot(1600, 80, 8, 2, 0.3, 300, 2100, 850, (280, 230, 170, 100, 50, 20, 0))
PEAGLE = BackendView("p", "http://p", "m", "p-eagle", 7, "B200", 1)
PLAIN = BackendView("q", "http://q", "m", "plain", None, "B200", 1)


def test_difference_and_vllms_formulas() -> None:
    o = difference(BEFORE, AFTER, 2.0)
    assert o is not None
    assert (o.output_tokens, o.drafts, o.accepted) == (600, 200, 600)
    assert o.running == 10  # 8 running and 2 waiting at the later scrape
    tally = Tally()
    o = replace(o, finished=3.0)  # the 3 requests this gateway sent it and saw end
    tally.add(o, InFlightClock(in_flight_s=16.0, busy_s=2.0, ended=3))
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
    for in_flight, seconds in ((2, 1.0), (6, 3.0)):
        clock = InFlightClock(in_flight * seconds, seconds, 0)
        tally.add(replace(difference(BEFORE, AFTER, seconds), finished=0.0), clock)  # type: ignore[type-var]
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


def _interval(tokens: float, seconds: float, finished: float, running: float) -> Observation:
    """What a scrape interval of `seconds` shows: `tokens` generated, `finished` requests
    finished, `running` requests at the later scrape."""
    after = replace(
        BEFORE,
        generation_tokens=BEFORE.generation_tokens + tokens,
        e2e_latency_count=finished,
        running=running,
        waiting=0,
    )
    observed = difference(replace(BEFORE, e2e_latency_count=0.0), after, seconds)
    assert observed is not None
    return observed


def test_an_idle_part_of_the_window_is_left_out_of_the_rate() -> None:
    """One request busy for 1 s of a 2 s interval: its rate while it ran."""
    tally = Tally()
    tally.add(_interval(300, 2.0, 1, 0), InFlightClock(in_flight_s=1.0, busy_s=1.0, ended=1))
    m = tally.measurement(PLAIN)
    assert (m.concurrency, m.output_tokens_per_s) == (1.0, 300.0)


def test_a_request_spanning_scrapes_counts_its_time_in_each() -> None:
    """A request spanning two scrapes: tokens and time in flight in both."""
    tally = Tally()
    tally.add(_interval(400, 2.0, 0, 1), InFlightClock(2.0, 2.0, 0))
    tally.add(_interval(400, 2.0, 1, 0), InFlightClock(2.0, 2.0, 1))
    m = tally.measurement(PLAIN)
    assert (m.concurrency, m.output_tokens_per_s) == (1.0, 200.0)


def test_one_long_stream_beside_one_token_requests_stays_at_its_rate() -> None:
    """The pattern that once stored 19x the real rate: one stream generating 430 tokens/s
    through a 20 s window, and 4 one-token requests of 20 ms every 5 s: the window stores
    the stream's rate at one request in flight (plus the short ones' share of the time)."""
    tally = Tally()
    for _ in range(4):  # 5 s scrapes
        clock = InFlightClock(in_flight_s=5.0 + 4 * 0.02, busy_s=5.0, ended=4)
        tally.add(_interval(430 * 5 + 4, 5.0, 4, 1), clock)
    m = tally.measurement(PLAIN)
    assert m.concurrency == pytest.approx(1.016)
    assert m.output_tokens_per_s == pytest.approx(430.8)  # the stream's 430 and 4 tokens


def test_a_backend_with_other_clients_is_measured_by_its_own_gauges_too() -> None:
    """It finished 20 requests, this gateway sent it 5: its gauges say 3 in flight, of
    which 1 this gateway's: the others held 2 over the interval, beside its own 1."""
    tally = Tally()
    clock = InFlightClock(in_flight_s=2.0, busy_s=2.0, ended=5)
    tally.add(_interval(2000, 2.0, 20, 3), clock, in_flight_now=1)
    assert tally.foreign()
    m = tally.measurement(PLAIN)
    assert (m.concurrency, m.output_tokens_per_s) == (3.0, 1000.0)
    ours = Tally()
    ours.add(_interval(2000, 2.0, 5, 3), InFlightClock(in_flight_s=2.0, busy_s=2.0, ended=5))
    assert not ours.foreign()  # the gauge's instant is not trusted over the clock
    assert ours.measurement(PLAIN).concurrency == 1.0


def test_a_window_with_nothing_in_flight_is_not_stored() -> None:
    tally = Tally()
    tally.add(_interval(600, 2.0, 0, 0), InFlightClock())
    assert tally.rejection(Gate(min_requests=0, min_output_tokens=1)) == "nothing_in_flight"


def test_a_rate_above_the_hardware_is_rejected() -> None:
    """gpt-oss-20b on one B200 cannot stream one sequence at 8,000 tokens/s: its weights
    alone take 1.6 ms to read at the datasheet's bandwidth, about 1,650 tokens/s."""
    gate = Gate(min_requests=1, min_output_tokens=1, ceiling_margin=2.0)
    demo = BackendView("d", "http://d", "openai/gpt-oss-20b", "plain", None, "B200", 1)
    tally = Tally()
    tally.add(_interval(8000 * 2, 2.0, 5, 1), InFlightClock(2.0, 2.0, 5))
    assert gate.above_ceiling(tally.measurement(demo))
    real = Tally()
    real.add(_interval(430 * 2, 2.0, 5, 1), InFlightClock(2.0, 2.0, 5))
    assert not gate.above_ceiling(real.measurement(demo))
    assert not gate.above_ceiling(tally.measurement(PLAIN))  # model "m": no ceiling known
    assert not Gate(1, 1).above_ceiling(tally.measurement(demo))  # never checked


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
        tally.add(difference(before, after, 2.0), InFlightClock(4.0, 2.0, finished or 0))  # type: ignore[arg-type]
        return tally

    assert window(3, 4000).rejection(gate) == "too_few_requests"
    assert window(10, 40).rejection(gate) == "too_few_tokens"  # ten short test requests
    assert window(None, 40).rejection(gate) == "too_few_tokens"
    assert window(None, 4000).rejection(gate) is None  # a server without the count: tokens only
    full = window(20, 4000)
    assert full.rejection(gate) is None
    m = full.measurement(PLAIN)
    assert (m.requests, m.mean_prompt_tokens, m.mean_output_tokens) == (20, 100.0, 200.0)
