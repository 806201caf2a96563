"""What the selector chose, as one frozen value.

Every round the selector (gateway/control/selector.py) publishes its choices whole, in place
of the last (`Registry.choices`), as the registry publishes its `Snapshot`: a request
captures both once and routes by a view no round can change halfway. A replica's leader
serialises this value for its workers and followers (gateway/server/replica.py), which adopt
it whole.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from types import MappingProxyType

import orjson

from gateway.policy.moves import Move
from gateway.schemas.reports import FleetNow


@dataclass(frozen=True, slots=True)
class Choices:
    """The selector's choices: read-only mappings, replaced whole, never changed."""

    auto: Mapping[str, str] = field(default_factory=dict)  # the method per auto model
    # per (auto model, request class with an objective of its own)
    classes: Mapping[tuple[str, str], str] = field(default_factory=dict)
    moves: Mapping[str, Move] = field(default_factory=dict)  # gradual moves, per auto model
    fleet_now: Mapping[str, FleetNow] = field(default_factory=dict)  # sizing, this round

    def __post_init__(self) -> None:
        for name in ("auto", "classes", "moves", "fleet_now"):  # a copy no caller holds
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))

    def method(self, model: str, request_class: str | None = None) -> str | None:
        """The method chosen for `model`'s `request_class` (a class with an objective of its
        own), else for the model; None before the selector's first choice."""
        if request_class is not None:
            chosen = self.classes.get((model, request_class))
            if chosen is not None:
                return chosen
        return self.auto.get(model)

    def to_json(self) -> bytes:
        state = {
            "auto": dict(self.auto),
            "classes": [[m, c, method] for (m, c), method in self.classes.items()],
            "moves": {m: asdict(move) for m, move in self.moves.items()},
            "fleet_now": {m: now.model_dump() for m, now in self.fleet_now.items()},
        }
        return orjson.dumps(state)

    @classmethod
    def from_json(cls, data: bytes) -> Choices:
        state = orjson.loads(data)
        return cls(
            auto=state["auto"],
            classes={(m, c): method for m, c, method in state["classes"]},
            moves={m: Move(**move) for m, move in state["moves"].items()},
            fleet_now={m: FleetNow.model_validate(v) for m, v in state["fleet_now"].items()},
        )
