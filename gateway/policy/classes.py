"""Request classes: what `auto` optimises for each kind of traffic, pure.

A request's class is the `x-draftgate-class` header, else its API key's class, else
`interactive`; the names a gateway accepts are `DRAFTGATE_REQUEST_CLASSES`. A model's
policy may give a class its own objective:

- `cost`: the lowest $/1M output tokens among methods within `itl_objective_ms` (none
  within it: the fastest), the policy's own objective, for batch traffic;
- `latency`: the lowest ITL among methods within `max_usd_per_mtok` (none within it: the
  cheapest), for interactive traffic that pays for speed up to a ceiling.

The selector keeps a choice per (model, class) with its objective, priced at the model's
whole load (classes share the pools); a class without an objective of its own follows the
policy's. Both are priced from the same curves at the same load, so they differ only by
what they optimise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Objective = Literal["cost", "latency"]
CLASS_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,31}$"
MAX_CLASSES = 16


@dataclass(frozen=True, slots=True)
class ClassView:
    """One class's objective, as the selector reads it."""

    objective: Objective = "cost"
    itl_objective_ms: float | None = None  # cost: the ITL ceiling
    max_usd_per_mtok: float | None = None  # latency: the cost ceiling


def compile_classes(stored: Mapping[str, Mapping[str, Any]] | None) -> dict[str, ClassView]:
    """A policy's stored classes as views (validated when they were written)."""
    return {
        name: ClassView(
            objective=c.get("objective", "cost"),
            itl_objective_ms=c.get("itl_objective_ms"),
            max_usd_per_mtok=c.get("max_usd_per_mtok"),
        )
        for name, c in (stored or {}).items()
    }


def candidates(
    objective: ClassView, costs: Mapping[str, float], itls: Mapping[str, float]
) -> dict[str, float]:
    """The methods this objective may choose, each with its score (lower is better): $/1M
    for `cost`, ITL ms for `latency`. `costs` and `itls` have the same methods."""
    if not costs:
        return {}
    if objective.objective == "latency":
        cap = objective.max_usd_per_mtok
        within = {m: itls[m] for m in costs if cap is None or costs[m] <= cap}
        if within:
            return within
        cheapest = min(costs, key=costs.__getitem__)
        return {cheapest: itls[cheapest]}
    ceiling = objective.itl_objective_ms
    within = {m: c for m, c in costs.items() if ceiling is None or itls[m] <= ceiling}
    if within:
        return within
    fastest = min(itls, key=itls.__getitem__)
    return {fastest: costs[fastest]}
