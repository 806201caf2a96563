"""The benchmark runner's open-loop arrivals and what a level reports about its load."""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
import statistics

import pytest

from backends.bench import (
    BenchConfig,
    LevelResult,
    arrival_schedule_s,
    interarrival_gaps_s,
    vllm_bench_json,
)

DRAWS = 20_000  # the mean of 20k exponential gaps is within 1% of 1/rate (sigma 0.7%)


def config(**fields: object) -> BenchConfig:
    """A sweep of one level at 10 requests/s unless `fields` say otherwise."""
    base = BenchConfig(url="http://127.0.0.1:9", model="m", concurrency=(4,), rate_per_s=10.0)
    return dataclasses.replace(base, **fields)  # type: ignore[arg-type]


def gaps(rate: float, poisson: bool, burstiness: float = 1.0, seed: int = 1) -> list[float]:
    drawn = interarrival_gaps_s(rate, poisson, burstiness, random.Random(seed))
    return list(itertools.islice(drawn, DRAWS))


def test_evenly_spaced_gaps_are_all_one_over_the_rate() -> None:
    assert set(gaps(4.0, poisson=False)) == {0.25}


def test_poisson_gaps_are_exponential_with_mean_one_over_the_rate() -> None:
    drawn = gaps(5.0, poisson=True)
    mean = statistics.fmean(drawn)
    assert mean == pytest.approx(0.2, rel=0.03)
    assert statistics.pstdev(drawn) / mean == pytest.approx(1.0, rel=0.05)  # exponential: CV 1
    longer = sum(g > 0.2 for g in drawn) / DRAWS
    assert longer == pytest.approx(math.exp(-1), abs=0.02)  # P(gap > mean) = 1/e


@pytest.mark.parametrize(("burstiness", "cv"), [(0.25, 2.0), (4.0, 0.5)])
def test_burstiness_changes_the_spread_of_gaps_not_their_mean(burstiness: float, cv: float) -> None:
    drawn = gaps(5.0, poisson=True, burstiness=burstiness)
    mean = statistics.fmean(drawn)
    assert mean == pytest.approx(0.2, rel=0.05)
    assert statistics.pstdev(drawn) / mean == pytest.approx(cv, rel=0.1)  # gamma: 1/sqrt(shape)


def test_gaps_are_the_same_for_the_same_seed_only() -> None:
    assert gaps(5.0, poisson=True, seed=7) == gaps(5.0, poisson=True, seed=7)
    assert gaps(5.0, poisson=True, seed=7) != gaps(5.0, poisson=True, seed=8)


def test_an_even_schedule_of_n_requests_sends_one_every_gap() -> None:
    due = list(arrival_schedule_s(config(requests_per_level=4, rate_per_s=2.0)))
    assert due == pytest.approx([0.5, 1.0, 1.5, 2.0])


def test_a_poisson_schedule_of_n_requests_ends_at_n_over_rate_as_vllm_rescales_it() -> None:
    due = list(arrival_schedule_s(config(requests_per_level=50, poisson=True, seed=3)))
    assert len(due) == 50
    assert due[-1] == pytest.approx(5.0)
    assert all(0 < a < b for a, b in itertools.pairwise(due))
    spacing = [b - a for a, b in itertools.pairwise(due)]
    assert statistics.pstdev(spacing) > 0.03  # random, unlike the even schedule's 0
    again = list(arrival_schedule_s(config(requests_per_level=50, poisson=True, seed=3)))
    other = list(arrival_schedule_s(config(requests_per_level=50, poisson=True, seed=4)))
    assert again == due
    assert other != due


def test_a_schedule_with_a_duration_sends_until_it_has_passed() -> None:
    even = list(arrival_schedule_s(config(duration_s=1.05)))
    assert even == pytest.approx([0.1 * n for n in range(1, 11)])
    poisson = list(arrival_schedule_s(config(duration_s=100.0, poisson=True, seed=5)))
    assert len(poisson) == pytest.approx(1000, rel=0.1)  # 10/s for 100 s
    assert max(poisson) < 100.0


def level(**fields: object) -> LevelResult:
    """A level of 20 requests over 2 s at concurrency 8, 1.5 requests in flight on average."""
    base = LevelResult(
        concurrency=8,
        duration_s=2.0,
        completed=20,
        failed=0,
        output_tokens=640,
        input_tokens=2000,
        output_tokens_per_s=320.0,
        ttft_ms=[10.0],
        itl_ms=[2.0],
        e2e_ms=[150.0],
        acceptance_length=None,
        acceptance_per_position=None,
        mean_in_flight=1.5,
    )
    return dataclasses.replace(base, **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("load", "request_rate", "burstiness"),
    [
        ({"rate_per_s": None}, "inf", 1.0),
        ({"rate_per_s": 10.0}, 10.0, "inf"),
        ({"rate_per_s": 10.0, "poisson": True}, 10.0, 1.0),
        ({"rate_per_s": 10.0, "poisson": True, "burstiness": 0.5}, 10.0, 0.5),
    ],
)
def test_vllm_bench_json_carries_the_request_rate_and_burstiness(
    load: dict[str, object], request_rate: float | str, burstiness: float | str
) -> None:
    body = vllm_bench_json(config(**load), level())
    assert (body["request_rate"], body["burstiness"]) == (request_rate, burstiness)
    assert body["max_concurrency"] == 8
    assert body["request_throughput"] == 10.0


def test_open_loop_levels_report_the_achieved_rate_and_load_at_their_real_concurrency() -> None:
    closed = level()
    assert closed.load_concurrency == 8
    assert "achieved_request_rate" not in vllm_bench_json(config(rate_per_s=None), closed)
    opened = level(request_rate_per_s=10.0, achieved_request_rate_per_s=9.6)
    assert opened.load_concurrency == 1.5  # the cap of 8 was never reached
    assert vllm_bench_json(config(), opened)["achieved_request_rate"] == 9.6


def test_a_level_runs_at_least_its_requests_per_client() -> None:
    config = BenchConfig("http://x", "m", (1, 4, 64), requests_per_level=50, requests_per_client=8)
    assert [config.at_level(c).requests_per_level for c in (1, 4, 64)] == [50, 50, 512]
    exact = BenchConfig("http://x", "m", (64,), requests_per_level=50)
    assert exact.at_level(64).requests_per_level == 50  # a count given alone is exact
