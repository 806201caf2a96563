"""Pricing a request at its own context: the KV cache each of its steps reads."""

from __future__ import annotations

import pytest

from gateway.context import context_model

MODEL, GPU = "openai/gpt-oss-20b", "B200"
LINE = (1.0, 4.0, 16.0, 64.0, 256.0)


def test_a_context_longer_than_the_curves_pays_for_its_kv_reads_and_a_shorter_one_less() -> None:
    plain = context_model(MODEL, "plain", GPU, 0, LINE, (1000.0, 400.0), None)
    assert plain is not None
    assert plain.mean_tokens == 1200.0  # the prompt and half the answer
    slope, share = plain.at(16.0)
    assert slope > 0
    assert 0 < share < 1
    # one step per output token for plain: (8,000 - 1,200) context tokens more, each step
    usd = plain.usd(8000.0, 1000, 16.0, 6.0, 1.0)
    assert usd == pytest.approx(6800 * slope * 1000 * 6.0 / 3600)
    assert plain.usd(1200.0, 1000, 16.0, 6.0, 1.0) == 0.0
    # a context of nothing saves its KV reads, never more than their share of the cost
    short = plain.usd(0.0, 1000, 16.0, 6.0, 1e-9)
    assert short == pytest.approx(-share * 1e-9)


def test_speculation_reads_the_kv_cache_once_for_several_tokens() -> None:
    """At 32k tokens of context, 1,000 output tokens cost plain 1,000 steps of KV reads and
    p-eagle (3.7 tokens per step at K=7) about 270: its correction is that much smaller."""
    plain = context_model(MODEL, "plain", GPU, 0, LINE, None, None)
    peagle = context_model(MODEL, "p-eagle", GPU, 7, LINE, None, 3.7)
    assert plain is not None
    assert peagle is not None
    extra_plain = plain.usd(32768.0, 1000, 16.0, 6.0, 1.0)
    extra_peagle = peagle.usd(32768.0, 1000 / peagle.acceptance, 16.0, 6.0, 1.0)
    assert extra_peagle < extra_plain / 3


def test_a_model_the_planner_does_not_know_gets_no_correction() -> None:
    assert context_model("org/unknown", "plain", GPU, 0, LINE, None, None) is None
