"""The simulator's periodic stats lines, in the shape vLLM's own logger prints them (its
`LoggingStatLogger` and spec-decoding logging, every 10 s while there is traffic), so a
backend's log reads like a vLLM server's: throughput, running and waiting requests, KV cache
use, and for a speculative method its acceptance."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

logger = logging.getLogger("backends.sim.engine")
INTERVAL_S = 10.0


@dataclass
class StatTally:
    """What the engine did since the last line (wall seconds)."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    drafts: int = 0
    draft_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)

    def add_step(self, prompt: int, generated: int) -> None:
        self.prompt_tokens += prompt
        self.generation_tokens += generated

    def add_drafts(self, drafts: int, draft_tokens: int, accepted_per_pos: Sequence[int]) -> None:
        self.drafts += drafts
        self.draft_tokens += draft_tokens
        grow = len(accepted_per_pos) - len(self.accepted_per_pos)
        self.accepted_per_pos += [0] * max(0, grow)
        for i, accepted in enumerate(accepted_per_pos):
            self.accepted_per_pos[i] += accepted

    def lines(self, seconds: float, running: int, waiting: int, kv_usage: float) -> list[str]:
        """vLLM's lines for this interval (none when the engine did nothing)."""
        if not (self.prompt_tokens or self.generation_tokens or running or waiting):
            return []
        found = [
            f"Engine 000: Avg prompt throughput: {self.prompt_tokens / seconds:.1f} tokens/s, "
            f"Avg generation throughput: {self.generation_tokens / seconds:.1f} tokens/s, "
            f"Running: {running} reqs, Waiting: {waiting} reqs, "
            f"GPU KV cache usage: {100 * kv_usage:.1f}%"
        ]
        if self.drafts:
            accepted = sum(self.accepted_per_pos)
            rates = ", ".join(f"{a / self.drafts:.3f}" for a in self.accepted_per_pos)
            found.append(
                f"SpecDecoding metrics: Mean acceptance length: {1 + accepted / self.drafts:.2f}, "
                f"Accepted throughput: {accepted / seconds:.2f} tokens/s, "
                f"Drafted throughput: {self.draft_tokens / seconds:.2f} tokens/s, "
                f"Accepted: {accepted} tokens, Drafted: {self.draft_tokens} tokens, "
                f"Per-position acceptance rate: {rates}, "
                f"Avg Draft acceptance rate: {100 * accepted / max(self.draft_tokens, 1):.1f}%"
            )
        return found


async def log_forever(
    take: Callable[[], StatTally], state: Callable[[], tuple[int, int, float]]
) -> None:
    """Every `INTERVAL_S`, log what `take()` hands over (and resets) beside the engine's
    `state()` (running, waiting, KV cache use); runs until cancelled."""
    loop = asyncio.get_running_loop()
    last = loop.time()
    while True:
        await asyncio.sleep(INTERVAL_S)
        now = loop.time()
        for line in take().lines(now - last, *state()):
            logger.info("%s", line)
        last = now
