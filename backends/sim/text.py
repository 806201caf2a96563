"""Deterministic pseudo-text and a rough tokenizer, so responses look and count like text."""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Sequence

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


def prompt_words(text: str) -> list[str]:
    """The tokens `count_tokens` counts, as strings."""
    return _TOKEN.findall(text)


def template_words(parts: Sequence[tuple[str, str]]) -> list[str]:
    """A chat prompt's tokens: each message's template tokens (its role, then markers) and
    content, then the assistant prefix; as many as the chat accounting counts."""
    words: list[str] = []
    for role, content in parts:
        words.append(f"<|{role}|>")
        words.extend(["<|>"] * (CHAT_TEMPLATE_TOKENS - 1))
        words.extend(_TOKEN.findall(content))
    words.extend(["<|assistant|>"] * CHAT_PROMPT_TOKENS)
    return words


VOCAB = {word: i for i, word in enumerate(WORDS, start=1000)}  # the output's token ids


def token_ids(text: str) -> list[int]:
    """The ids of pseudo-text's tokens (" word" each)."""
    return ids_of(prompt_words(text))


def ids_of(words: Sequence[str]) -> list[int]:
    """The ids of tokens given as strings; one not of the vocabulary (a prompt's) gets a
    stable id of its own beyond it."""
    return [VOCAB.get(w) or 2000 + seed_of(w) % 30_000 for w in words]


def seed_of(text: str) -> int:
    """A stable 64-bit seed from text (Python's `hash` is salted per process)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


DIVERGED = 0x5EED  # mixed into the seed from a diverging answer's first changed token on


class PseudoText:
    """An endless deterministic stream of tokens (" word") seeded by the prompt; with
    `diverge_at`, another stream from that token on (a lossy verify path's answer)."""

    def __init__(self, seed: int, diverge_at: int | None = None) -> None:
        self._rng = random.Random(seed)
        self._seed, self._taken, self._diverge_at = seed, 0, diverge_at

    def take(self, n: int) -> str:
        """The next `n` tokens as text."""
        at = self._diverge_at
        if at is not None and self._taken <= at < self._taken + n:
            kept = at - self._taken
            before = self._words(kept)
            self._rng, self._diverge_at = random.Random(self._seed ^ DIVERGED), None
            return before + self._words(n - kept)
        return self._words(n)

    def _words(self, n: int) -> str:
        choice, words = self._rng.choice, WORDS
        self._taken += n
        return "".join(" " + choice(words) for _ in range(n))
