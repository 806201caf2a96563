"""Token counts out of every usage shape, and bad values set aside (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.relay.usage import MAX_TOKENS, Tokens, tokens_of


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        ({"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}, Tokens(5, 3)),
        ({"input_tokens": 5, "output_tokens": 3}, Tokens(5, 3)),  # Responses, messages
        ({"input_tokens": 2, "cache_read_input_tokens": 3, "output_tokens": 1}, Tokens(5, 1)),
        ({"prompt_tokens": 9, "total_tokens": 9}, Tokens(9, 0)),  # embeddings
        ({"prompt_tokens": 4.0, "completion_tokens": None}, Tokens(4, 0)),
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
