"""Stored measurements: every read of the measurements table, in one place.

The planner fits and checks itself on points per GPU (`per_gpu_points`, `by_hardware`); the
live curves that price requests take them averaged per concurrency bin (`aggregates`); the
backends view takes each backend's newest acceptance (`latest_acceptance`); the admin API
lists them (`newest`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gateway.curves import Aggregate, CurveKey
from gateway.db.tables import Backend, Measurement
from planner.fit_measurements import MeasuredPoint, concurrency_bin


def newest(
    session: Session, model: str | None, backend: str | None, source: str | None, limit: int
) -> list[Measurement]:
    """Stored measurements, newest first, optionally of one model, backend or source."""
    query = select(Measurement).order_by(Measurement.id.desc()).limit(limit)
    if model is not None:
        query = query.where(Measurement.model == model)
    if backend is not None:
        query = query.where(Measurement.backend_name == backend)
    if source is not None:
        query = query.where(Measurement.source == source)
    return list(session.scalars(query))


def per_gpu_points(session: Session, model: str, gpu: str) -> list[MeasuredPoint]:
    """The measurements of `model` on `gpu`, per GPU (tokens/s divided by the GPU count)."""
    rows = session.scalars(
        select(Measurement).where(Measurement.model == model, Measurement.gpu_type == gpu)
    )
    return [per_gpu(r) for r in rows]


def per_gpu(r: Measurement) -> MeasuredPoint:
    """A stored measurement as the planner fits it: output tokens/s per GPU."""
    return MeasuredPoint(
        r.method, r.k, r.concurrency, r.output_tokens_per_s / r.gpu_count, r.mean_acceptance_length
    )


def by_hardware(session: Session) -> dict[tuple[str, str], list[Measurement]]:
    """Every measurement, oldest first, grouped by (model, GPU type)."""
    groups: dict[tuple[str, str], list[Measurement]] = {}
    for row in session.scalars(select(Measurement).order_by(Measurement.id)):
        groups.setdefault((row.model, row.gpu_type), []).append(row)
    return groups


def aggregates(session: Session) -> list[Aggregate]:
    """Every measured point, averaged per (model, method, GPU type, concurrency bin)."""
    m = Measurement
    query = (
        select(
            m.model,
            m.method,
            m.gpu_type,
            m.concurrency,
            func.max(m.k),
            func.count(),
            func.avg(m.output_tokens_per_s / m.gpu_count),
            func.avg(m.mean_acceptance_length),
        )
        .where(m.concurrency > 0, m.output_tokens_per_s > 0)
        .group_by(m.model, m.method, m.gpu_type, m.concurrency)
    )
    bins: dict[tuple[CurveKey, float], list[tuple[int, int, float, float | None]]]
    bins = defaultdict(list)
    for model, method, gpu, c, k, n, tps, al in session.execute(query):
        bins[((model, method, gpu), concurrency_bin(float(c)))].append((int(k), n, float(tps), al))
    return [_aggregate(key, c, rows) for (key, c), rows in bins.items()]


def _aggregate(
    key: CurveKey, c: float, rows: list[tuple[int, int, float, float | None]]
) -> Aggregate:
    count = sum(n for _, n, _, _ in rows)
    tps = sum(n * t for _, n, t, _ in rows) / count
    seen = [(n, float(al)) for _, n, _, al in rows if al is not None]
    al = sum(n * a for n, a in seen) / sum(n for n, _ in seen) if seen else None
    return Aggregate(key, max(k for k, _, _, _ in rows), c, tps, al)


def latest_acceptance(session: Session, rows: Sequence[Backend]) -> dict[str, Measurement]:
    """Per backend, its newest stored measurement with acceptance at its current method and K."""
    names = [row.name for row in rows if row.method != "plain"]
    if not names:
        return {}
    newest = (
        select(func.max(Measurement.id))
        .where(Measurement.backend_name.in_(names), Measurement.mean_acceptance_length.is_not(None))
        .group_by(Measurement.backend_name, Measurement.method, Measurement.k)
    )
    found = session.scalars(select(Measurement).where(Measurement.id.in_(newest)))
    wanted = {(row.name, row.method, row.k or 0) for row in rows}
    return {
        m.backend_name: m
        for m in found
        if m.backend_name is not None and (m.backend_name, m.method, m.k) in wanted
    }
