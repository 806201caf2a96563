"""Admin API for benchmark runs: start a sweep against a backend, read progress, cancel."""

from __future__ import annotations

from fastapi import APIRouter

from gateway.deps import SessionDep
from gateway.schemas.benchmarks import BenchmarkCreate, BenchmarkPublic
from gateway.schemas.resources import ListOf
from gateway.services import benchmarks

router = APIRouter(prefix="/benchmarks", tags=["benchmarks"])


@router.post("", status_code=202)
def start_benchmark(data: BenchmarkCreate, session: SessionDep) -> BenchmarkPublic:
    """Queue a sweep; the replica's leader starts it within a second. Poll it at
    GET /admin/v1/benchmarks/{id}."""
    return BenchmarkPublic.model_validate(benchmarks.queue_benchmark(session, data))


@router.get("")
def list_benchmarks(session: SessionDep) -> ListOf[BenchmarkPublic]:
    """Runs, newest first (the last 100)."""
    rows = benchmarks.recent_benchmarks(session)
    return ListOf[BenchmarkPublic](data=[BenchmarkPublic.model_validate(r) for r in rows])


@router.get("/{run_id}")
def get_benchmark(run_id: int, session: SessionDep) -> BenchmarkPublic:
    """One run: status, progress, results."""
    return BenchmarkPublic.model_validate(benchmarks.get_benchmark(session, run_id))


@router.delete("/{run_id}")
def cancel_benchmark(run_id: int, session: SessionDep) -> BenchmarkPublic:
    """Cancel a run that is queued or running, whichever worker or replica runs it (its
    leader stops it within a second, keeping the levels it completed)."""
    return BenchmarkPublic.model_validate(benchmarks.cancel_benchmark(session, run_id))
