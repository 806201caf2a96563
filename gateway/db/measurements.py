"""Stored measurements: every read of the measurements table, in one place.

The planner fits and checks itself on points per GPU (`per_gpu_points`, `by_hardware`); the
live curves that price requests take them pooled per K and concurrency bin (`pooled`); the
backends view takes each backend's newest acceptance (`latest_acceptance`); the admin API
lists them (`newest`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from gateway.curves import Aggregate, Rejections, Sample, pool
from gateway.db.tables import Backend, Measurement
from planner.fit_measurements import MeasuredPoint


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


def pooled(
    session: Session, scrape_since: dt.datetime | None = None
) -> tuple[list[Aggregate], Rejections]:
    """Every usable measurement pooled per (model, method, GPU, K, concurrency bin), and
    what the shape and outlier rules kept out; collector windows older than `scrape_since`
    no longer count (sweeps and imports count until deleted)."""
    m = Measurement
    query = select(
        m.model,
        m.method,
        m.gpu_type,
        m.k,
        m.concurrency,
        m.output_tokens_per_s / m.gpu_count,
        m.mean_acceptance_length,
        m.requests,
        m.mean_output_tokens,
        m.source,
        m.mean_prompt_tokens,
    ).where(m.concurrency > 0, m.output_tokens_per_s > 0)
    if scrape_since is not None:
        query = query.where(or_(m.source != "scrape", m.measured_at >= scrape_since))
    samples = [
        Sample((model, method, gpu), k, c, tps, al, requests, output, source, prompt)
        for model, method, gpu, k, c, tps, al, requests, output, source, prompt in (
            session.execute(query)
        )
    ]
    return pool(samples)


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
