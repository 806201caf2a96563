"""Right-sized fleets by hand: given per-GPU curves and an hourly traffic table, the replicas,
GPU-hours and bills per method."""

from __future__ import annotations

import pytest

from planner.cost import ThroughputCurve
from planner.rightsize import Hour, replica_capacity, replicas_needed, size_hours

# Per-GPU output tokens/s by streams in flight. Plain: 20 ms per token alone, 25 ms at 8
# streams, 50 ms at 64; the speculative method: 6.7 ms alone, 24 ms at 32 streams, 40 ms at
# 64, and it saturates at half plain's throughput.
PLAIN = ThroughputCurve.from_points(
    [(1, 50), (2, 95), (4, 180), (8, 320), (16, 512), (32, 768), (64, 1280), (256, 3200)]
)
SPEC = ThroughputCurve.from_points(
    [(1, 150), (2, 290), (4, 540), (8, 800), (16, 1000), (32, 4000 / 3), (64, 1600)]
)


def test_within_a_25_ms_objective_a_replica_runs_at_its_highest_concurrency_that_meets_it() -> None:
    plain = replica_capacity(PLAIN, 1, 25.0)
    # The next step, 8.7 streams, makes 344 tokens/s at 25.4 ms.
    assert (plain.concurrency, plain.output_tokens_per_s, plain.itl_ms) == (8, 320, 25)
    spec = replica_capacity(SPEC, 1, 25.0)
    # 32 streams: 1333.3 tokens/s, 24 ms per token; the next step (34.9 streams) is 25.5 ms.
    assert spec.concurrency == 32
    assert spec.output_tokens_per_s == pytest.approx(4000 / 3)
    assert spec.itl_ms == pytest.approx(24.0)
    assert plain.meets_objective
    assert spec.meets_objective


def test_an_objective_no_stream_meets_sizes_at_one_stream_and_says_so() -> None:
    plain = replica_capacity(PLAIN, 1, 10.0)  # 20 ms per token even alone
    assert not plain.meets_objective
    assert (plain.concurrency, plain.output_tokens_per_s, plain.itl_ms) == (1, 50, 20)


def test_a_replica_of_several_gpus_is_that_many_times_one_gpu_of_the_curve() -> None:
    # Curves are per GPU (a backend's tokens/s over its GPU count), as the live prices use them.
    assert replica_capacity(PLAIN, 4, None).output_tokens_per_s == 4 * 3200


def test_without_an_objective_a_replica_is_sized_for_throughput_alone() -> None:
    assert replica_capacity(PLAIN, 1, None).output_tokens_per_s == 3200
    assert replica_capacity(SPEC, 1, None).output_tokens_per_s == 1600


def test_replicas_are_whole_with_headroom_and_a_floor() -> None:
    capacity = replica_capacity(PLAIN, 1, 25.0)  # 320 tokens/s
    assert replicas_needed(0.0, capacity, 0.2, 1) == 1
    assert replicas_needed(0.0, capacity, 0.2, 0) == 0
    assert replicas_needed(320.0, capacity, 0.0, 1) == 1  # exactly full
    assert replicas_needed(320.0, capacity, 0.2, 1) == 2  # 384 / 320
    assert replicas_needed(1000.0, capacity, 0.2, 1) == 4  # 1200 / 320 = 3.75


def test_hourly_bills_under_a_latency_objective_and_for_throughput_alone() -> None:
    # Three hours of one model's traffic: quiet, busy, and half an hour (the period ends).
    hours = [Hour(100.0), Hour(3000.0), Hour(1000.0, hours=0.5)]

    def gpu_hours(curve: ThroughputCurve, objective: float | None) -> list[float]:
        capacity = replica_capacity(curve, 1, objective)
        sized = size_hours(hours, capacity, 1, headroom=0.0, min_replicas=1)
        return [h.gpu_hours for h in sized]

    # Within 25 ms per token a plain replica serves 320 tokens/s, a speculative one 1333.3:
    # plain needs 1, ceil(9.4) = 10 and ceil(3.1) = 4 replicas, speculation 1, 3 and 1.
    assert gpu_hours(PLAIN, 25.0) == [1, 10, 2]  # the last hour counts half
    assert gpu_hours(SPEC, 25.0) == [1, 3, 0.5]
    usd = 3.0  # per GPU-hour
    assert sum(gpu_hours(PLAIN, 25.0)) * usd == 39.0
    assert sum(gpu_hours(SPEC, 25.0)) * usd == 13.5  # achievable savings: $25.50
    # Sized for throughput alone a plain replica serves 3200 tokens/s, a speculative one
    # 1600: the quiet hour is a tie at the floor, and in the busy hour plain needs fewer.
    assert gpu_hours(PLAIN, None) == [1, 1, 0.5]
    assert gpu_hours(SPEC, None) == [1, 2, 0.5]
