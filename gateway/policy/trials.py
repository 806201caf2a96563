"""Drafter trials: an A/B of two drafters of one method.

A drafter upgrade is the most frequent change on a speculative fleet. A model's policy may
send `share` of a method's requests to its backends that run the trial's `drafter` and the
rest to the method's other backends, so the two run side by side on the same traffic; each
request's drafter is on its usage record, and `GET /admin/v1/savings?group_by=drafter`
reports each side's cost, acceptance and their 95% intervals. A request's side is its
session key's place (a conversation stays on one drafter, its prefix cache with it), else a
random draw. When the method's backends do not run both sides, the trial does nothing; when
one side has no healthy backend, the other serves (its backends come next in the order).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from gateway.policy.moves import position_of

B = TypeVar("B")
SALT = 0x74726961  # "tria": a request's side, independent of its place in a gradual move


@dataclass(frozen=True, slots=True)
class DrafterTrial:
    """`share` of a method's requests to its backends running `drafter`."""

    drafter: str
    share: float

    def split(
        self, pool: Sequence[B], drafter_of: Callable[[B], str | None], key: int | None, draw: float
    ) -> tuple[list[B], list[B]]:
        """The request's side of `pool` and the other side (last resort); the whole pool
        and nothing when it does not run both."""
        trial = [b for b in pool if drafter_of(b) == self.drafter]
        if not trial or len(trial) == len(pool):
            return list(pool), []
        control = [b for b in pool if drafter_of(b) != self.drafter]
        if position_of(key, draw, SALT) < self.share:
            return trial, control
        return control, trial


def stored_trial(record: Mapping[str, Any] | None) -> DrafterTrial | None:
    """The trial a models row records, if any."""
    if not record:
        return None
    return DrafterTrial(str(record["drafter"]), float(record["share"]))
