"""Policy rules: the request-feature vocabulary, each feature against requests that have it
and requests that do not."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from gateway.policy.rules import Request, compile_rules, feature_test, first_match
from gateway.schemas.resources import Policy


def has(feature: str, body: dict[str, Any], request_class: str = "interactive") -> bool:
    return feature_test(feature)(Request(body, request_class))


@pytest.mark.parametrize(
    ("feature", "with_it", "without_it"),
    [
        (
            "structured_output",
            [{"response_format": {"type": "json_object"}},
             {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
             {"text": {"format": {"type": "json_schema"}}},  # the Responses API
             {"structured_outputs": {"regex": "a+"}}, {"guided_json": {}},
             {"guided_choice": ["a", "b"]}],
            [{}, {"response_format": {"type": "text"}}, {"response_format": "json_object"},
             {"text": {"format": {"type": "text"}}}, {"guided_json": None}],
        ),
        (
            "logprobs",
            [{"logprobs": True}, {"logprobs": True, "top_logprobs": 5}, {"logprobs": 0},
             {"top_logprobs": 2}, {"prompt_logprobs": 1}],
            [{}, {"logprobs": False}, {"logprobs": None}, {"top_logprobs": 0}],
        ),
        (
            "penalties",
            [{"presence_penalty": 0.5}, {"frequency_penalty": -1}, {"repetition_penalty": 1.1}],
            [{}, {"presence_penalty": 0}, {"frequency_penalty": 0.0}, {"repetition_penalty": 1},
             {"presence_penalty": "0.5"}],
        ),
        (
            "n_gt_1",
            [{"n": 2}, {"best_of": 3}],
            [{}, {"n": 1}, {"n": True}, {"best_of": 1}],
        ),
        (
            "temperature_above:0.8",
            [{"temperature": 0.9}, {"temperature": 2}, {}],  # absent: 1, OpenAI's default
            [{"temperature": 0.8}, {"temperature": 0}, {"temperature": 0.5}],
        ),
    ],
)  # fmt: skip
def test_each_feature(
    feature: str, with_it: list[dict[str, Any]], without_it: list[dict[str, Any]]
) -> None:
    assert [has(feature, body) for body in with_it] == [True] * len(with_it)
    assert [has(feature, body) for body in without_it] == [False] * len(without_it)


def test_the_class_feature_reads_the_request_class() -> None:
    assert has("class:batch", {}, "batch")
    assert not has("class:batch", {}, "interactive")


def test_the_prompt_length_feature_reads_the_estimate_made_before_routing() -> None:
    long = feature_test("prompt_tokens_above:8000")
    assert long(Request({}, "interactive", 8001))
    assert not long(Request({}, "interactive", 8000))
    assert not long(Request({}, "interactive"))  # no estimate: 0


@pytest.mark.parametrize(
    "feature", ["", "json", "temperature_above:", "temperature_above:hot",
                "temperature_above:nan", "class:", "class:a\nb", "logprobs:1",
                "prompt_tokens_above:", "prompt_tokens_above:-1", "prompt_tokens_above:1.5",
                "prompt_tokens_above:1e9", "prompt_tokens_above:1234567890"]
)  # fmt: skip
def test_an_unknown_feature_is_refused_naming_the_vocabulary(feature: str) -> None:
    with pytest.raises(ValueError, match=r"structured_output|takes a|feature"):
        feature_test(feature)


def test_the_first_rule_whose_every_feature_matches_picks_the_method() -> None:
    policy = Policy(
        rules=[
            {"when": ["structured_output", "logprobs"], "method": "eagle3", "k": 3},
            {"when": ["structured_output"], "method": "plain"},
            {"when": ["class:batch"], "method": "p-eagle"},
        ]
    )
    rules = compile_rules(policy.model_dump()["rules"])
    json_format = {"response_format": {"type": "json_object"}}
    both = first_match(rules, Request(json_format | {"logprobs": True}, "interactive"))
    assert both is not None
    assert (both.index, both.method, both.k) == (0, "eagle3", 3)
    one = first_match(rules, Request(json_format, "batch"))
    assert one is not None
    assert (one.index, one.method) == (1, "plain")
    batch = first_match(rules, Request({}, "batch"))
    assert batch is not None
    assert batch.index == 2
    assert first_match(rules, Request({"logprobs": True}, "interactive")) is None


@pytest.mark.parametrize(
    "rules",
    [
        [{"when": ["nonsense"], "method": "plain"}],
        [{"when": [], "method": "plain"}],
        [{"when": ["logprobs"], "method": "plain", "k": 3}],
        [{"when": ["logprobs"], "method": "warp-drive"}],
        [{"when": ["logprobs"]}],
        [{"when": ["logprobs"], "method": "plain", "extra": 1}],
        [{"when": ["logprobs"], "method": "plain"}] * 33,
    ],
)
def test_bad_rules_are_refused(rules: list[dict[str, Any]]) -> None:
    with pytest.raises(ValidationError):
        Policy(rules=rules)
