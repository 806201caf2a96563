"""Gradual method moves, pure: a model's traffic shifts from one method to another in steps.

When `auto` or an admin moves a model to another method, the new method's pool starts with
a cold KV cache (and, autoscaled, too few replicas). So the move goes in steps: the target
takes `move_step_share` of the traffic at once and another share every `move_step_s`
seconds, until it takes all of it. The share is a function of the wall clock since the move
began, so every gateway replica computes the same one from the same start.

Which requests move first is decided by their session key when they have one (affinity
keeps a session on one side until the share passes its place: a conversation moves once,
never back and forth), else at random.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.policy.affinity import MASK, mix

FULL = 1.0


@dataclass(frozen=True, slots=True)
class Move:
    """A model moving from `source` to `target`, begun at `started` (epoch seconds)."""

    source: str
    target: str
    started: float
    step_share: float
    step_s: float

    def steps_taken(self, now: float) -> int:
        """Steps done by `now`: the first at the start, then one every `step_s`."""
        if now < self.started:
            return 1
        if self.step_s <= 0:
            return self.steps_total
        return min(1 + int((now - self.started) // self.step_s), self.steps_total)

    @property
    def steps_total(self) -> int:
        """Steps until the target takes everything."""
        return max(1, math.ceil(FULL / self.step_share - 1e-9)) if self.step_share > 0 else 1

    def share(self, now: float) -> float:
        """The target's share of the traffic at `now`."""
        return min(FULL, self.steps_taken(now) * self.step_share) if self.step_share > 0 else FULL

    def done(self, now: float) -> bool:
        return self.share(now) >= FULL

    @property
    def duration_s(self) -> float:
        """From the start until the target takes everything."""
        return (self.steps_total - 1) * max(self.step_s, 0.0)

    def goes_to_target(self, now: float, position: float) -> bool:
        """Whether a request at `position` in [0, 1) is served by the target now."""
        return position < self.share(now)


def position_of(key: int | None, draw: float, salt: int = 0x6D6F7665) -> float:
    """A request's place in [0, 1): its session key's, else the random `draw` (`salt`:
    whose place; a gradual move's, "move", by default)."""
    return draw if key is None else mix(key ^ salt) / (MASK + 1)


def move_record(source: str, started: float, step_share: float, step_s: float) -> dict[str, Any]:
    """A move as the models table keeps it."""
    return {"from": source, "started_at": started, "step_share": step_share, "step_s": step_s}


def stored_move(record: Mapping[str, Any] | None, target: str | None) -> Move | None:
    """The move a models row records toward its pinned `target`, if any."""
    if not record or target is None:
        return None
    return Move(
        str(record["from"]),
        target,
        float(record["started_at"]),
        float(record["step_share"]),
        float(record["step_s"]),
    )
