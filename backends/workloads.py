"""Workload presets of the benchmark runner: prompts and output lengths shaped like real traffic.

`synthetic` sends fixed lengths (the runner's original behaviour). `code`, `chat` and `math`
take their mean prompt and output lengths from the planner's calibration (the workloads its
published figures were measured on) and vary them per request, uniformly within a spread
around the mean; prompts are cut from a few hand-written passages of the kind. Every request
is a pure function of the preset, the means, the seed and the request's index, so a run is
reproducible and needs no dataset.
"""

from __future__ import annotations

import functools
import random
import re
from dataclasses import dataclass
from typing import Literal, TypedDict, get_args

from planner import calibration

WorkloadName = Literal["synthetic", "code", "chat", "math"]
WORKLOAD_NAMES: tuple[str, ...] = get_args(WorkloadName)
DEFAULT_INPUT_LEN = 128  # synthetic prompt tokens (vllm bench serve's random dataset uses 1024)
DEFAULT_OUTPUT_LEN = 128  # synthetic output tokens
MIN_BODY_TOKENS = 8  # the cut passage never shrinks below this, whatever the lead costs
# A rough token: a word or one punctuation mark, with the whitespace after it.
_PIECE = re.compile(r"\w+\s*|[^\w\s]\s*")


class ChatMessage(TypedDict):
    """One message of a chat completion request."""

    role: str
    content: str


@dataclass(frozen=True)
class Preset:
    """How one kind of traffic looks; the spreads are assumptions, not measurements."""

    name: str
    passage: str  # the text each prompt is cut from, cycled from a random word
    instruction: str = ""  # written before the cut text in the last user message
    lead: tuple[ChatMessage, ...] = ()  # messages before it: a system prompt, earlier turns
    prompt_spread: float = 0.0  # prompt lengths: uniform in mean * (1 +- spread)
    output_spread: float = 0.0  # output lengths likewise


@dataclass(frozen=True)
class WorkloadRequest:
    """What one benchmark request sends."""

    messages: tuple[ChatMessage, ...]
    max_tokens: int
    prompt_tokens: int  # rough count of the prompt's tokens (words and punctuation)


CODE = """def merge_intervals(intervals):
    ordered = sorted(intervals, key=lambda pair: pair[0])
    merged = []
    for start, end in ordered:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


class LruCache:
    def __init__(self, capacity):
        self.capacity = capacity
        self.items = {}

    def get(self, key):
        if key not in self.items:
            return None
        value = self.items.pop(key)
        self.items[key] = value
        return value

    def put(self, key, value):
        self.items.pop(key, None)
        if len(self.items) >= self.capacity:
            oldest = next(iter(self.items))
            del self.items[oldest]
        self.items[key] = value


def parse_duration(text):
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    number, unit = text[:-1], text[-1]
    if text.endswith("ms"):
        number, unit = text[:-2], "ms"
    return float(number) * units[unit]
"""

CHAT = (
    "Thanks, that helps a lot. One more thing: my sister is flying in on Friday evening and "
    "we want to do something fun on Saturday that is not too expensive. She likes museums, "
    "good coffee and long walks, but she hates crowds. Could you suggest a plan for the day, "
    "with a place for lunch and something to do if it rains? Also, is it worth buying a "
    "city pass, or should we just pay for each place as we go? We will probably take the "
    "train in from the suburbs, so somewhere near the central station would be ideal. "
)

MATH = (
    "A bakery sells muffins for $3 each and cookies for $1.50 each. On Monday it sold 48 "
    "muffins and twice as many cookies. How much money did it take in on Monday? "
    "A train leaves the station at 9:15 and travels 180 km at an average speed of 72 km per "
    "hour. At what time does it arrive? "
    "Maria has 3 times as many marbles as Tom. Together they have 64 marbles. After Maria "
    "gives Tom 10 marbles, how many more marbles does Maria have than Tom? "
    "A rectangular garden is 12 m long and 7.5 m wide. A path 1 m wide runs around the "
    "outside of it. What is the area of the path? "
)

PRESETS: dict[str, Preset] = {
    "synthetic": Preset(
        "synthetic", "the model drafts tokens and the target verifies them in one step "
    ),
    "code": Preset(
        "code",
        CODE,
        instruction="Finish this Python module: add type hints, docstrings and tests, and "
        "return the complete code.\n\n",
        prompt_spread=0.5,
        output_spread=0.5,
    ),
    "chat": Preset(
        "chat",
        CHAT,
        lead=(
            {"role": "system", "content": "You are a friendly and concise assistant."},
            {"role": "user", "content": "Hi! I'm planning a weekend in the city."},
            {"role": "assistant", "content": "Lovely! What kind of things do you enjoy?"},
        ),
        prompt_spread=0.6,
        output_spread=0.6,
    ),
    "math": Preset(
        "math",
        MATH,
        instruction="Solve the following problems. Reason step by step and give each final "
        "answer on its own line.\n\n",
        lead=({"role": "system", "content": "You are a careful math tutor."},),
        prompt_spread=0.3,
        output_spread=0.4,
    ),
}
assert set(PRESETS) == set(WORKLOAD_NAMES), "presets out of step with WorkloadName"


def mean_lengths(workload: str) -> tuple[int, int]:
    """A preset's mean prompt and output tokens (synthetic: the defaults)."""
    if workload == "synthetic":
        return DEFAULT_INPUT_LEN, DEFAULT_OUTPUT_LEN
    shape = calibration.workloads()[workload]
    return shape.prompt_tokens, shape.output_tokens


def resolve_lengths(
    workload: str, input_len: int | None, output_len: int | None
) -> tuple[int, int]:
    """The means a sweep uses: the preset's, each overridden when given."""
    prompt, output = mean_lengths(workload)
    return input_len or prompt, output_len or output


@dataclass(frozen=True)
class BenchWorkload:
    """A preset with its mean lengths and seed; the request of each index."""

    preset: str
    input_len: int
    output_len: int
    seed: int = 0

    def request(self, index: int) -> WorkloadRequest:
        """Request `index` of a level: the same for the same preset, means, seed and index."""
        preset = PRESETS[self.preset]
        rng = random.Random(f"{self.seed}:{index}")  # noqa: S311  (not secrets)
        prompt_tokens = _vary(self.input_len, preset.prompt_spread, rng)
        max_tokens = _vary(self.output_len, preset.output_spread, rng)
        fixed = sum(count_tokens(m["content"]) for m in preset.lead)
        fixed += count_tokens(preset.instruction)
        body = max(MIN_BODY_TOKENS, prompt_tokens - fixed)
        pieces, starts = _pieces(preset.passage), _word_starts(preset.passage)
        text = _cut(pieces, body, rng.choice(starts))
        last: ChatMessage = {"role": "user", "content": preset.instruction + text}
        return WorkloadRequest((*preset.lead, last), max_tokens, fixed + body)


def count_tokens(text: str) -> int:
    """Rough tokens of `text`: words and punctuation marks."""
    return len(_PIECE.findall(text))


def _vary(mean: int, spread: float, rng: random.Random) -> int:
    return max(1, round(mean * (1 + rng.uniform(-spread, spread))))


@functools.cache
def _pieces(passage: str) -> tuple[str, ...]:
    return tuple(_PIECE.findall(passage))


@functools.cache
def _word_starts(passage: str) -> tuple[int, ...]:
    """Where a prompt may begin: at any word (many different prompts, none opening on a `)`)."""
    return tuple(i for i, piece in enumerate(_pieces(passage)) if piece[0].isalnum())


def _cut(pieces: tuple[str, ...], tokens: int, start: int) -> str:
    """`tokens` pieces of the passage, cycling from piece `start`."""
    return "".join(pieces[(start + i) % len(pieces)] for i in range(tokens)).rstrip()
