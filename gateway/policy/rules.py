"""Policy rules: which request features send a request to which method.

A model's policy may hold an ordered list of rules, `[{"when": ["structured_output"],
"method": "plain"}]`. The first rule whose every feature the request has picks the method
(and K); the policy's own choice serves the rest. Speculative decoding handles some requests
badly: structured outputs and high temperatures accept few drafts, and engines have
limitations with logprobs, penalties and `n > 1`; a platform team sends those to plain (or a
pool of its choice) by rule.

The vocabulary, read from the request body (chat, completions and the Responses API):

- `structured_output`: `response_format` of type `json_object`, `json_schema` or
  `structural_tag`, the Responses API's `text.format` of those types, or any of vLLM's
  `structured_outputs`, `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`;
- `logprobs`: `logprobs` asked for (true, or a number for completions), `top_logprobs` > 0,
  or `prompt_logprobs`;
- `penalties`: a non-zero `presence_penalty` or `frequency_penalty`, or a
  `repetition_penalty` other than 1;
- `n_gt_1`: `n` or `best_of` above 1;
- `temperature_above:<x>`: `temperature` above x (absent, it is 1, the OpenAI default);
- `class:<name>`: the request's class (gateway/policy/classes.py): the `x-draftgate-class` header,
  else its key's class, else the first of `DRAFTGATE_REQUEST_CLASSES` (`interactive`);
- `prompt_tokens_above:<n>`: a prompt of more than n tokens, estimated before routing as the
  admission estimate is (the body's bytes over 4, or its token ids counted). Long contexts are
  memory-bound and change what speculation gains; some drafters accept less deep into one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

CLASS_HEADER = b"x-draftgate-class"
MAX_RULES = 32
STRUCTURED_TYPES = frozenset({"json_object", "json_schema", "structural_tag"})
GUIDED_FIELDS = (
    "structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Request:
    """What a rule may look at: the parsed body and the request's class."""

    body: Mapping[str, Any]
    request_class: str
    prompt_tokens: int = 0  # estimated before routing


Test = Callable[[Request], bool]


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def structured_output(r: Request) -> bool:
    fmt = r.body.get("response_format")
    if isinstance(fmt, Mapping) and fmt.get("type") in STRUCTURED_TYPES:
        return True
    text = r.body.get("text")
    if isinstance(text, Mapping):
        fmt = text.get("format")
        if isinstance(fmt, Mapping) and fmt.get("type") in STRUCTURED_TYPES:
            return True
    return any(r.body.get(name) is not None for name in GUIDED_FIELDS)


def logprobs(r: Request) -> bool:
    asked = r.body.get("logprobs")
    if asked is True or _number(asked) is not None:  # a number: completions' top-n
        return True
    top = _number(r.body.get("top_logprobs"))
    return bool(top) or r.body.get("prompt_logprobs") is not None


def penalties(r: Request) -> bool:
    presence = _number(r.body.get("presence_penalty")) or 0.0
    frequency = _number(r.body.get("frequency_penalty")) or 0.0
    repetition = _number(r.body.get("repetition_penalty"))
    return presence != 0 or frequency != 0 or (repetition is not None and repetition != 1)


def n_gt_1(r: Request) -> bool:
    return any((_number(r.body.get(name)) or 1) > 1 for name in ("n", "best_of"))


def _temperature_above(limit: float) -> Test:
    def test(r: Request) -> bool:
        temperature = _number(r.body.get("temperature"))
        return (1.0 if temperature is None else temperature) > limit

    return test


def _prompt_tokens_above(limit: int) -> Test:
    def test(r: Request) -> bool:
        return r.prompt_tokens > limit

    return test


def _class_is(name: str) -> Test:
    def test(r: Request) -> bool:
        return r.request_class == name

    return test


FEATURES: dict[str, Test] = {
    "structured_output": structured_output,
    "logprobs": logprobs,
    "penalties": penalties,
    "n_gt_1": n_gt_1,
}
PARAMETERIZED = ("temperature_above:<number>", "class:<name>", "prompt_tokens_above:<n>")


def feature_test(feature: str) -> Test:
    """The test a feature names; ValueError naming the vocabulary if it names none."""
    if feature in FEATURES:
        return FEATURES[feature]
    kind, sep, argument = feature.partition(":")
    if sep and kind == "temperature_above":
        try:
            limit = float(argument)
        except ValueError:
            limit = math.nan
        if not math.isfinite(limit):
            raise ValueError(f"temperature_above takes a number, got {argument!r}")
        return _temperature_above(limit)
    if sep and kind == "prompt_tokens_above":
        if not (argument.isdigit() and len(argument) <= 9):  # isdigit: no sign, no point
            raise ValueError(f"prompt_tokens_above takes a whole number, got {argument!r}")
        return _prompt_tokens_above(int(argument))
    if sep and kind == "class" and argument and argument.isprintable() and len(argument) <= 64:
        return _class_is(argument)
    known = ", ".join([*FEATURES, *PARAMETERIZED])
    raise ValueError(f"unknown request feature {feature!r}; known: {known}")


@dataclass(frozen=True, slots=True)
class RuleView:
    """A compiled rule: its position in the policy, its tests, the method and K it picks."""

    index: int
    tests: tuple[Test, ...]
    method: str
    k: int | None


def compile_rules(rules: list[dict[str, Any]] | None) -> tuple[RuleView, ...]:
    """The stored rules as the relay checks them (validated when they were set)."""
    return tuple(
        RuleView(i, tuple(feature_test(f) for f in rule["when"]), rule["method"], rule.get("k"))
        for i, rule in enumerate(rules or ())
    )


def first_match(rules: tuple[RuleView, ...], request: Request) -> RuleView | None:
    """The first rule all of whose features the request has."""
    for rule in rules:
        if all(test(request) for test in rule.tests):
            return rule
    return None
