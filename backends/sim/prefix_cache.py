"""vLLM's automatic prefix caching, as the simulator keeps it: full blocks of prompt tokens,
named by a hash chained over every block before them, kept in the KV budget and evicted
least recently used first.

A request's prompt is cut into blocks of `block_size` tokens; block i's hash covers its
tokens and block i-1's hash, so two prompts share a cached block only if they share every
token up to its end. At admission the engine looks up the request's blocks in order and
skips the prefill of the leading run it finds, keeping at least the last prompt token to
compute (vLLM computes it to get the first output's logits); when a request's prefill is
done its blocks are cached. Blocks of generated text are not cached here (vLLM caches them
too, so a real multi-turn hit rate is higher than the simulator's).

The budget is the engine's KV cache in blocks. Blocks held by running requests count
against it, so a busy server keeps less of its past: the cache holds at most the blocks
left free, evicting the least recently used.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence

DEFAULT_BLOCK_SIZE = 16  # vLLM's default on GPUs (its CPU backend uses 128)


def block_hashes(tokens: Sequence[str], block_size: int) -> tuple[bytes, ...]:
    """The chained hash of every full block of `tokens`."""
    hashes: list[bytes] = []
    parent = b""
    for end in range(block_size, len(tokens) + 1, block_size):
        digest = hashlib.blake2b(parent, digest_size=16)
        digest.update("\x1f".join(tokens[end - block_size : end]).encode())
        parent = digest.digest()
        hashes.append(parent)
    return tuple(hashes)


class PrefixCache:
    """Cached block hashes, least recently used first."""

    def __init__(self, block_size: int, capacity_blocks: int) -> None:
        self.block_size = block_size
        self.capacity_blocks = capacity_blocks
        self._blocks: OrderedDict[bytes, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def cached_tokens(self, hashes: Sequence[bytes], prompt_tokens: int) -> int:
        """Prompt tokens whose KV is cached: the leading run of cached blocks, short of the
        last prompt token. The blocks found become the most recently used."""
        usable = (prompt_tokens - 1) // self.block_size
        found = 0
        for block in hashes[:usable]:
            if block not in self._blocks:
                break
            self._blocks.move_to_end(block)
            found += 1
        return found * self.block_size

    def insert(self, hashes: Sequence[bytes], blocks_in_use: int) -> None:
        """Cache a request's blocks, then evict down to the blocks running requests leave."""
        for block in hashes:
            self._blocks[block] = None
            self._blocks.move_to_end(block)
        self.evict(blocks_in_use)

    def evict(self, blocks_in_use: int) -> None:
        """Drop the least recently used blocks beyond what the budget leaves free."""
        room = max(self.capacity_blocks - blocks_in_use, 0)
        while len(self._blocks) > room:
            self._blocks.popitem(last=False)
