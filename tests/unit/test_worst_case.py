"""What a request reserves at admission: every sequence a backend will generate for it (each
prompt of a `/v1/completions` list, `n` times, or `best_of` times where larger), and its
prompts (counted where they are token ids). Hand-computed; a 40-byte body is 10 tokens."""

from __future__ import annotations

import pytest

from gateway.relay.checks import worst_case_tokens

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
LIMIT = 1000


@pytest.mark.parametrize(
    ("path", "payload", "body_bytes", "expected"),
    [
        (COMPLETIONS, {"prompt": ["a", "b", "c"], "max_tokens": 50}, 40, 10 + 3 * 50),
        (COMPLETIONS, {"prompt": ["a", "b", "c"], "max_tokens": 50, "n": 2}, 40, 10 + 6 * 50),
        (COMPLETIONS, {"prompt": ["a", "b"], "max_tokens": 50, "n": 2, "best_of": 3}, 40, 310),
        (COMPLETIONS, {"prompt": "a", "max_tokens": 50, "n": 3, "best_of": 2}, 40, 10 + 150),
        (COMPLETIONS, {"prompt": ["a", "b"]}, 40, 10 + 2 * 16),  # vLLM's default, each
        (COMPLETIONS, {"prompt": ["a"], "max_tokens": 5000}, 40, 10 + 1000),  # limit, each
        (COMPLETIONS, {"prompt": [[1] * 30, [2] * 30], "max_tokens": 5}, 40, 60 + 2 * 5),
        (COMPLETIONS, {"prompt": [7] * 30, "max_tokens": 5}, 40, 30 + 5),  # one prompt of ids
        (COMPLETIONS, {"prompt": ["a"] * 3, "max_tokens": 1}, 20_000, 3 * LIMIT + 3),
        (COMPLETIONS, {"prompt": "a", "max_tokens": 1}, 20_000, LIMIT + 1),
        (COMPLETIONS, {"prompt": [], "max_tokens": 50}, 40, 10 + 50),  # vLLM refuses it
        (CHAT, {"prompt": ["a", "b"], "max_tokens": 50}, 40, 10 + 50),  # not a chat field
        (CHAT, {"max_tokens": 50, "best_of": 4}, 40, 10 + 4 * 50),
        (CHAT, {"max_tokens": 50, "n": 2, "best_of": True}, 40, 10 + 2 * 50),  # not a count
        ("/v1/embeddings", {"input": ["a", "b"]}, 40, 10),  # the prompt only
    ],
)
def test_every_sequence_is_reserved(
    path: str, payload: dict[str, object], body_bytes: int, expected: int
) -> None:
    assert worst_case_tokens(path, payload, body_bytes, LIMIT) == expected
