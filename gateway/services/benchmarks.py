"""Benchmark runs: queue a sweep against a backend, read runs, cancel one.

The runs themselves are the leader's (`gateway.control.benchmarks`); this is what the
admin API asks of them, through the database."""

from __future__ import annotations

from sqlalchemy import update
from sqlalchemy.orm import Session

from gateway.db import queries
from gateway.db.base import utcnow
from gateway.db.tables import BenchmarkRun
from gateway.errors import Conflict, NotFound
from gateway.schemas.benchmarks import BenchmarkCreate

RECENT_RUNS = 100  # how many runs a listing shows


def queue_benchmark(session: Session, data: BenchmarkCreate) -> BenchmarkRun:
    """Queue a sweep against the backend `data.backend` (a replica's leader starts it)."""
    backend = queries.get_backend(session, data.backend)
    run = BenchmarkRun(
        status="queued",
        model=backend.model,
        url=backend.url,
        backend_name=backend.name,
        params=data.model_dump(),
    )
    session.add(run)
    session.flush()  # its id; committed before the answer goes out
    return run


def recent_benchmarks(session: Session) -> list[BenchmarkRun]:
    """The last runs, newest first."""
    return session.query(BenchmarkRun).order_by(BenchmarkRun.id.desc()).limit(RECENT_RUNS).all()


def get_benchmark(session: Session, run_id: int) -> BenchmarkRun:
    """One run; NotFound when there is none."""
    row = session.get(BenchmarkRun, run_id)
    if row is None:
        raise NotFound(f"benchmark run {run_id} not found", param="run_id")
    return row


def cancel_benchmark(session: Session, run_id: int) -> BenchmarkRun:
    """Mark a queued or running run cancelled (its leader stops it within a second, keeping
    the levels it completed); Conflict when it has already ended."""
    row = get_benchmark(session, run_id)
    cancelled = session.execute(
        update(BenchmarkRun)
        .where(BenchmarkRun.id == run_id, BenchmarkRun.status.in_(("queued", "running")))
        .values(status="cancelled", finished_at=utcnow())
    )
    session.refresh(row)
    if not cancelled.rowcount:  # type: ignore[attr-defined]
        raise Conflict(f"benchmark run {run_id} already {row.status}", code="not_running")
    return row
