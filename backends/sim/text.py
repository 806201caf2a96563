"""Deterministic pseudo-text and a rough tokenizer, so responses look and count like text."""

from __future__ import annotations

import hashlib
import random
import re

_TOKEN = re.compile(r"\w+|[^\w\s]")
# A small vocabulary; the words carry no meaning, only a plausible shape.
WORDS = (
    "the of and to in is that for it as with was on be by this are from at or an which "
    "model token draft verify accept batch cache latency throughput memory kernel tensor "
    "layer head request stream server value result function return data time step cost "
    "speed load queue node graph weight sample output input prompt context window block "
    "parallel decode prefill rate length position budget policy method gateway backend "
    "so then when each we can will not all more one two three first next also only other"
).split()
CHAT_TEMPLATE_TOKENS = 9  # role markers and separators a chat template adds per message
CHAT_PROMPT_TOKENS = 3  # the assistant prefix after the last message


def count_tokens(text: str) -> int:
    """Approximate token count: words and punctuation marks."""
    return len(_TOKEN.findall(text))


def seed_of(text: str) -> int:
    """A stable 64-bit seed from text (Python's `hash` is salted per process)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class PseudoText:
    """An endless deterministic stream of tokens (" word") seeded by the prompt."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def take(self, n: int) -> str:
        """The next `n` tokens as text."""
        choice, words = self._rng.choice, WORDS
        return "".join(" " + choice(words) for _ in range(n))
