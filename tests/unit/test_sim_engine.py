"""The simulated engine: batching limits, token accounting, acceptance statistics."""

from __future__ import annotations

from dataclasses import replace

import pytest

from backends.sim.config import SimConfig, acceptance_profile, build_engine
from backends.sim.engine import EngineCore, SimRequest
from planner.acceptance import AcceptanceProfile

GPT_OSS = SimConfig(model="openai/gpt-oss-20b", method="p-eagle", k=7, workload="code")


def request(n: int, tokens: int = 100, profile: AcceptanceProfile | None = None) -> SimRequest:
    return SimRequest(
        f"r{n}",
        prompt_tokens=50,
        max_tokens=tokens,
        stop_at=tokens,
        acceptance=profile,
        arrived_s=0.0,
    )


def drain(core: EngineCore, max_steps: int = 100_000) -> tuple[float, list[SimRequest]]:
    """Run steps until idle; returns the simulated time and finished requests in order."""
    now, finished = 0.0, []
    for _ in range(max_steps):
        if core.idle:
            return now, finished
        result = core.step(now)
        now += result.duration_s
        finished += result.finished
    raise AssertionError("engine did not drain")


def test_every_request_gets_exactly_its_tokens() -> None:
    core = build_engine(GPT_OSS)
    profile = acceptance_profile(GPT_OSS)
    requests = [request(n, tokens=37 + n, profile=profile) for n in range(10)]
    for r in requests:
        core.add(r)
    _, finished = drain(core)
    assert sorted(finished, key=lambda r: r.request_id) == sorted(
        requests, key=lambda r: r.request_id
    )
    assert [r.generated for r in requests] == [37 + n for n in range(10)]
    assert all(r.finish_reason == "length" for r in requests)
    assert all(r.first_token_s is not None and r.first_token_s > 0 for r in requests)


def test_natural_end_is_a_stop() -> None:
    core = build_engine(replace(GPT_OSS, method="plain", k=None))
    r = replace(request(0, tokens=100), stop_at=20)
    core.add(r)
    drain(core)
    assert (r.generated, r.finish_reason) == (20, "stop")


def test_max_num_seqs_bounds_the_batch_and_the_rest_wait() -> None:
    core = build_engine(replace(GPT_OSS, max_num_seqs=4))
    for n in range(10):
        core.add(request(n))
    core.step(0.0)
    assert (len(core.running), len(core.waiting)) == (4, 6)


def test_kv_budget_limits_admission() -> None:
    core = build_engine(GPT_OSS)
    per_request = core.step_model.model.kv_bytes_for_context(51)
    core.limits = replace(core.limits, kv_cache_bytes=per_request * 3.5)
    for n in range(6):
        core.add(request(n))
    core.step(0.0)
    assert len(core.running) == 3
    assert 0.8 < core.kv_usage() <= 1.0


def test_full_kv_cache_preempts_and_still_finishes_everything() -> None:
    core = build_engine(GPT_OSS)
    core.limits = replace(
        core.limits, kv_cache_bytes=core.step_model.model.kv_bytes_for_context(400)
    )
    requests = [request(n, tokens=150) for n in range(3)]
    for r in requests:
        core.add(r)
    preempted = 0
    now = 0.0
    while not core.idle:
        result = core.step(now)
        now += result.duration_s
        preempted += result.preempted
    assert preempted > 0
    assert [r.generated for r in requests] == [150, 150, 150]


def test_measured_acceptance_matches_the_profile() -> None:
    profile = AcceptanceProfile((0.9, 0.7, 0.5, 0.3))
    core = build_engine(replace(GPT_OSS, k=4))
    for n in range(40):
        core.add(request(n, tokens=400, profile=profile))
    drafts, accepted, per_pos, now = 0, 0, [0] * 4, 0.0
    while not core.idle:
        result = core.step(now)
        now += result.duration_s
        drafts += result.drafts
        accepted += sum(result.accepted_per_pos)
        per_pos = [a + b for a, b in zip(per_pos, result.accepted_per_pos, strict=True)]
    survival = profile.survival(4)  # 0.9, 0.63, 0.315, 0.0945
    assert 1 + accepted / drafts == pytest.approx(profile.mean_acceptance_length(4), rel=0.03)
    for measured, expected in zip(per_pos, survival, strict=True):
        assert measured / drafts == pytest.approx(expected, abs=0.02)


def test_plain_decoding_drafts_nothing() -> None:
    core = build_engine(replace(GPT_OSS, method="plain", k=None))
    core.add(request(0))
    result = core.step(0.0)
    result = core.step(result.duration_s)
    assert (result.drafts, result.draft_tokens) == (0, 0)
    assert result.outputs[0][1] == 1


def test_adaptive_verification_verifies_less_under_load() -> None:
    dspark = replace(GPT_OSS, method="dspark", k=7, adaptive_verification=True, workload="chat")
    profile = acceptance_profile(dspark)

    def verified_per_draft(concurrency: int) -> float:
        core = build_engine(dspark)
        for n in range(concurrency):
            core.add(request(n, tokens=300, profile=profile))
        drafts = tokens = 0
        now = 0.0
        for _ in range(30):
            result = core.step(now)
            now += result.duration_s
            drafts, tokens = drafts + result.drafts, tokens + result.draft_tokens
        return tokens / drafts

    assert verified_per_draft(1) == 7
    assert verified_per_draft(256) < 7
