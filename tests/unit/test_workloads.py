"""Workload presets of the benchmark runner: lengths around the calibration's means, prompts
of the right kind, the same requests for the same seed."""

from __future__ import annotations

import statistics

import pytest

from backends.workloads import (
    PRESETS,
    WORKLOAD_NAMES,
    BenchWorkload,
    count_tokens,
    mean_lengths,
    resolve_lengths,
)
from planner import calibration

SAMPLE = 400  # requests per preset: their mean length is within ~3% of the preset's


@pytest.mark.parametrize("name", ["code", "chat", "math"])
def test_presets_take_their_mean_lengths_from_the_planner_calibration(name: str) -> None:
    shape = calibration.workloads()[name]
    assert mean_lengths(name) == (shape.prompt_tokens, shape.output_tokens)


def test_input_and_output_len_override_the_preset_means() -> None:
    prompt, output = mean_lengths("code")
    assert resolve_lengths("code", None, None) == (prompt, output)
    assert resolve_lengths("code", 300, None) == (300, output)
    assert resolve_lengths("code", None, 64) == (prompt, 64)
    assert resolve_lengths("synthetic", None, None) == (128, 128)  # the runner's defaults
    assert resolve_lengths("synthetic", 16, 32) == (16, 32)


def test_synthetic_requests_have_exactly_the_lengths_asked_for() -> None:
    workload = BenchWorkload("synthetic", input_len=40, output_len=24)
    requests = [workload.request(i) for i in range(20)]
    assert {r.max_tokens for r in requests} == {24}
    assert {r.prompt_tokens for r in requests} == {40}
    assert {count_tokens(r.messages[-1]["content"]) for r in requests} == {40}
    assert len({r.messages[-1]["content"] for r in requests}) > 5  # not one prompt repeated


@pytest.mark.parametrize("name", ["code", "chat", "math"])
def test_preset_lengths_vary_within_the_spread_around_the_mean(name: str) -> None:
    preset = PRESETS[name]
    workload = BenchWorkload(name, *mean_lengths(name), seed=11)
    requests = [workload.request(i) for i in range(SAMPLE)]
    outputs = [r.max_tokens for r in requests]
    prompts = [r.prompt_tokens for r in requests]
    for lengths, mean, spread in (
        (outputs, workload.output_len, preset.output_spread),
        (prompts, workload.input_len, preset.prompt_spread),
    ):
        assert statistics.fmean(lengths) == pytest.approx(mean, rel=0.05)
        assert mean * (1 - spread) - 1 <= min(lengths) < max(lengths) <= mean * (1 + spread) + 1
        assert statistics.pstdev(lengths) > mean * spread / 3  # uniform: sd = spread*mean/sqrt3


def test_a_request_counts_the_prompt_it_sends() -> None:
    for name in WORKLOAD_NAMES:
        request = BenchWorkload(name, 150, 100, seed=2).request(5)
        assert sum(count_tokens(m["content"]) for m in request.messages) == request.prompt_tokens


def test_requests_are_the_same_for_the_same_seed_and_index_only() -> None:
    first = BenchWorkload("chat", 100, 200, seed=1)
    assert [first.request(i) for i in range(10)] == [first.request(i) for i in range(10)]
    other = BenchWorkload("chat", 100, 200, seed=2)
    assert [first.request(i) for i in range(10)] != [other.request(i) for i in range(10)]
    assert first.request(0) != first.request(1)


def test_prompts_look_like_their_kind() -> None:
    code = BenchWorkload("code", 200, 100).request(0).messages
    assert [m["role"] for m in code] == ["user"]
    assert code[0]["content"].startswith("Finish this Python module")
    assert any(mark in code[0]["content"] for mark in ("def ", "self.", "return "))

    chat = BenchWorkload("chat", 100, 100).request(0).messages
    assert [m["role"] for m in chat] == ["system", "user", "assistant", "user"]

    math = BenchWorkload("math", 120, 100).request(0).messages
    assert [m["role"] for m in math] == ["system", "user"]
    assert "step by step" in math[1]["content"]
    assert any(ch.isdigit() for ch in math[1]["content"])  # word problems carry numbers
