"""Derivative-free minimisation (Nelder-Mead), for fitting model coefficients to data."""

from __future__ import annotations

from collections.abc import Callable, Sequence

Vector = list[float]


def nelder_mead(
    objective: Callable[[Sequence[float]], float],
    start: Sequence[float],
    *,
    step: float = 0.1,
    max_evaluations: int = 5000,
    tolerance: float = 1e-9,
) -> tuple[Vector, float]:
    """Minimise `objective` from `start`; returns (best point, its value)."""
    simplex = [list(start)] + [_moved(start, i, step) for i in range(len(start))]
    values = [objective(p) for p in simplex]
    evaluations = len(simplex)
    while evaluations < max_evaluations:
        order = sorted(range(len(simplex)), key=values.__getitem__)
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        if values[-1] - values[0] < tolerance:
            break
        centroid = _centroid(simplex[:-1])
        candidate, value, used = _next_vertex(objective, centroid, simplex[-1], values)
        evaluations += used
        if candidate is not None:
            simplex[-1], values[-1] = candidate, value
            continue
        simplex = [simplex[0]] + [_toward(simplex[0], p, 0.5) for p in simplex[1:]]
        values = [values[0]] + [objective(p) for p in simplex[1:]]
        evaluations += len(simplex) - 1
    best = min(range(len(simplex)), key=values.__getitem__)
    return simplex[best], values[best]


def _next_vertex(
    objective: Callable[[Sequence[float]], float],
    centroid: Vector,
    worst: Vector,
    values: list[float],
) -> tuple[Vector | None, float, int]:
    """Reflect, expand or contract the worst vertex; None asks the caller to shrink."""
    reflected = _toward(centroid, worst, -1.0)
    r = objective(reflected)
    if r < values[0]:
        expanded = _toward(centroid, worst, -2.0)
        e = objective(expanded)
        return (expanded, e, 2) if e < r else (reflected, r, 2)
    if r < values[-2]:
        return reflected, r, 1
    contracted = _toward(centroid, worst, 0.5)
    c = objective(contracted)
    if c < values[-1]:
        return contracted, c, 2
    return None, 0.0, 2


def _moved(point: Sequence[float], index: int, step: float) -> Vector:
    moved = list(point)
    moved[index] += step if moved[index] == 0 else step * abs(moved[index])
    return moved


def _centroid(points: Sequence[Sequence[float]]) -> Vector:
    return [sum(coords) / len(points) for coords in zip(*points, strict=True)]


def _toward(origin: Sequence[float], target: Sequence[float], fraction: float) -> Vector:
    """The point `fraction` of the way from `origin` to `target` (negative reflects)."""
    return [o + fraction * (t - o) for o, t in zip(origin, target, strict=True)]
