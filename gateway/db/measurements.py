"""Stored measurements: every read of the measurements table, in one place.

The planner fits and checks itself on a model's points on a GPU (`on_gpu`, `by_hardware`);
the live curves that price requests pool every usable one (`usable`); the backends view
takes each backend's newest acceptance (`latest_acceptance`); the admin API lists them
(`newest`). Rows only: what they mean to the planner and the curves is theirs to say.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from gateway.db.tables import Backend, Measurement


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


def on_gpu(session: Session, model: str, gpu: str) -> list[Measurement]:
    """The measurements of `model` on `gpu`."""
    rows = session.scalars(
        select(Measurement).where(Measurement.model == model, Measurement.gpu_type == gpu)
    )
    return list(rows)


def by_hardware(session: Session) -> dict[tuple[str, str], list[Measurement]]:
    """Every measurement, oldest first, grouped by (model, GPU type)."""
    groups: dict[tuple[str, str], list[Measurement]] = {}
    for row in session.scalars(select(Measurement).order_by(Measurement.id)):
        groups.setdefault((row.model, row.gpu_type), []).append(row)
    return groups


UsableRow = tuple[
    str, str, str, int, float, float, float | None, int | None, float | None, str, float | None,
    str | None, str | None,
]  # fmt: skip


def usable(session: Session, scrape_since: dt.datetime | None = None) -> list[UsableRow]:
    """Every measurement the curves may use, as (model, method, GPU type, K, concurrency,
    output tokens/s per GPU, mean acceptance length, requests, mean output tokens, source,
    mean prompt tokens, drafter, engine version); collector windows older than
    `scrape_since` no longer count (sweeps and imports count until deleted)."""
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
        m.drafter,
        m.engine_version,
    ).where(m.concurrency > 0, m.output_tokens_per_s > 0)
    if scrape_since is not None:
        query = query.where(or_(m.source != "scrape", m.measured_at >= scrape_since))
    return [tuple(row) for row in session.execute(query)]


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
