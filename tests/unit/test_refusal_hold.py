"""A caller refused for its key waits for its answer, and only so many wait at once."""

import asyncio
import random

from gateway.relay.checks import RefusalHold


async def test_a_refusal_is_held_its_seconds_and_the_held_are_bounded() -> None:
    hold = RefusalHold(seconds=3600.0, most=2)
    waiting = [asyncio.create_task(hold()) for _ in range(2)]
    await asyncio.sleep(0)  # each takes its place
    assert hold.held == 2
    assert not any(task.done() for task in waiting)  # an hour to go
    await asyncio.wait_for(hold(), timeout=60)  # a third is answered at once
    for task in waiting:
        task.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)
    assert hold.held == 0  # a caller gone mid-wait gives its place back
    await asyncio.wait_for(RefusalHold(seconds=0)(), timeout=60)  # 0: never held


def test_callers_refused_together_are_answered_apart() -> None:
    hold = RefusalHold(seconds=0.5, rng=random.Random(7))
    holds = [hold.draw() for _ in range(1000)]
    assert min(holds) >= 0.5  # never shorter than its seconds
    assert max(holds) <= 0.75
    assert max(holds) - min(holds) > 0.2  # spread over the range, not one moment
