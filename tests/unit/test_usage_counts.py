"""Token counts out of every usage shape, and bad values set aside (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.usage import MAX_TOKENS, Speculation, Tokens, speculation_in, tokens_of


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        ({"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}, Tokens(5, 3)),
        ({"input_tokens": 5, "output_tokens": 3}, Tokens(5, 3)),  # Responses, messages
        (
            {"input_tokens": 2, "cache_read_input_tokens": 3, "output_tokens": 1},
            Tokens(5, 1, cached=3),
        ),  # Anthropic-style: cache reads are prompt tokens too
        ({"prompt_tokens": 9, "total_tokens": 9}, Tokens(9, 0)),  # embeddings
        ({"prompt_tokens": 4.0, "completion_tokens": None}, Tokens(4, 0)),
        # vLLM with --enable-prompt-tokens-details; without it, null or no key: not said
        (
            {
                "prompt_tokens": 40,
                "completion_tokens": 2,
                "prompt_tokens_details": {"cached_tokens": 32},
            },
            Tokens(40, 2, cached=32),
        ),
        (
            {
                "prompt_tokens": 40,
                "completion_tokens": 2,
                "prompt_tokens_details": {"cached_tokens": 0},
            },
            Tokens(40, 2, cached=0),
        ),
        ({"prompt_tokens": 40, "prompt_tokens_details": None}, Tokens(40, 0)),
        ({"prompt_tokens": 40, "prompt_tokens_details": {"audio_tokens": 0}}, Tokens(40, 0)),
        (
            {
                "input_tokens": 40,
                "output_tokens": 2,  # the Responses API
                "input_tokens_details": {"cached_tokens": 16},
            },
            Tokens(40, 2, cached=16),
        ),
        (None, Tokens()),
        ({}, Tokens()),
    ],
)
def test_every_usage_shape_maps_to_one(usage: dict[str, Any] | None, expected: Tokens) -> None:
    assert tokens_of(usage) == expected


@pytest.mark.parametrize("bad", [1e30, MAX_TOKENS + 1, -1, 1.5, "3", True, [1], float("inf")])
def test_a_bad_count_is_set_aside_and_named(bad: object) -> None:
    assert tokens_of({"prompt_tokens": bad, "completion_tokens": 2}) == Tokens(
        0, 2, ("prompt_tokens",)
    )


@pytest.mark.parametrize(
    "bad", [41, 1e30, -1, 1.5, "3", True, [1], {"n": 1}, float("nan"), float("inf")]
)
@pytest.mark.parametrize("holder", ["prompt_tokens_details", "input_tokens_details"])
def test_a_bad_cached_count_is_set_aside_and_the_prompt_priced_whole(
    bad: object, holder: str
) -> None:
    """Not a whole number, or more than the prompt's 40 tokens: not said (None), named."""
    prompt = "prompt_tokens" if holder.startswith("prompt") else "input_tokens"
    usage = {prompt: 40, "completion_tokens": 2, holder: {"cached_tokens": bad}}
    assert tokens_of(usage) == Tokens(40, 2, (f"{holder}.cached_tokens",), None)


@pytest.mark.parametrize("details", ["32", 32, [32], True])
def test_details_that_are_not_an_object_are_set_aside(details: object) -> None:
    usage = {"prompt_tokens": 40, "prompt_tokens_details": details}
    assert tokens_of(usage) == Tokens(40, 0, ("prompt_tokens_details.cached_tokens",), None)


def test_cached_tokens_of_a_prompt_that_was_set_aside_are_set_aside_too() -> None:
    """A prompt count that could not be counted is 0: no cached count fits in it."""
    usage = {"prompt_tokens": -3, "prompt_tokens_details": {"cached_tokens": 16}}
    rejected = ("prompt_tokens", "prompt_tokens_details.cached_tokens")
    assert tokens_of(usage) == Tokens(0, 0, rejected, None)


def test_a_whole_prompt_may_be_cached() -> None:
    """vLLM always computes a prompt's last token, another backend may not: the bound is
    the prompt itself."""
    usage = {"prompt_tokens": 32, "prompt_tokens_details": {"cached_tokens": 32.0}}
    assert tokens_of(usage) == Tokens(32, 0, (), 32)


SPEC = {"num_spec_steps": 4, "num_draft_tokens": 28, "num_accepted_draft_tokens": 9}


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"metrics": {"speculative_decoding": SPEC}}, Speculation(4, 28, 9)),
        ({"response": {"metrics": {"speculative_decoding": SPEC}}}, Speculation(4, 28, 9)),
        (
            {
                "metrics": {
                    "speculative_decoding": SPEC
                    | {"num_spec_steps": 0, "num_draft_tokens": 0, "num_accepted_draft_tokens": 0}
                }
            },
            Speculation(0, 0, 0),
        ),
        ({"usage": {}}, None),  # not reported
        ({"metrics": None}, None),
        ({"metrics": {"speculative_decoding": "summary"}}, None),
        ({"metrics": {"speculative_decoding": SPEC | {"num_spec_steps": True}}}, None),
        ({"metrics": {"speculative_decoding": SPEC | {"num_draft_tokens": 4.0}}}, None),
        ({"metrics": {"speculative_decoding": SPEC | {"num_accepted_draft_tokens": -1}}}, None),
        ({"metrics": {"speculative_decoding": SPEC | {"num_accepted_draft_tokens": 29}}}, None),
        ({"metrics": {"speculative_decoding": SPEC | {"num_draft_tokens": 3}}}, None),
        ({"metrics": {"speculative_decoding": SPEC | {"num_spec_steps": MAX_TOKENS + 1}}}, None),
    ],
)
def test_a_requests_speculation_is_read_only_when_it_holds_together(
    body: dict[str, Any], expected: Speculation | None
) -> None:
    assert speculation_in(body) == expected
