"""Admin API for benchmark runs: start a sweep against a backend, read progress, cancel."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Request
from pydantic import Field, model_validator

from backends.bench import BenchConfig
from gateway.admin.schemas import Public, Strict
from gateway.db import queries
from gateway.db.session import transaction
from gateway.db.tables import BenchmarkRun
from gateway.deps import SessionDep, get_services
from gateway.errors import Conflict, NotFound

router = APIRouter(prefix="/benchmarks", tags=["benchmarks"])
Level = Annotated[int, Field(ge=1, le=1024)]


class BenchmarkCreate(Strict):
    """A sweep against one registered backend."""

    backend: str
    concurrency: list[Level] = Field(default_factory=lambda: [1, 4, 16], min_length=1)
    requests_per_level: int | None = Field(default=None, ge=1, le=100_000)
    duration_s: float | None = Field(default=None, gt=0, le=3600)
    input_len: int = Field(default=128, ge=1, le=32_768)
    output_len: int = Field(default=128, ge=1, le=32_768)

    @model_validator(mode="after")
    def _one_budget(self) -> BenchmarkCreate:
        if self.requests_per_level is None and self.duration_s is None:
            self.requests_per_level = 50
        return self


class BenchmarkPublic(Public):
    """A run as the API shows it."""

    id: int
    status: Literal["queued", "running", "succeeded", "failed", "cancelled"]
    model: str
    url: str
    backend_name: str | None
    params: dict[str, Any]
    progress: float
    error: str | None
    result: dict[str, Any] | None


@router.post("", status_code=202)
def start_benchmark(
    data: BenchmarkCreate, session: SessionDep, request: Request
) -> BenchmarkPublic:
    """Start a sweep in the background; poll it at GET /admin/v1/benchmarks/{id}."""
    backend = queries.get_backend(session, data.backend)
    services = get_services(request)
    run = BenchmarkRun(status="queued", model=backend.model, url=backend.url,
                       backend_name=backend.name, params=data.model_dump())  # fmt: skip
    with transaction(services.sessions) as own:  # committed before the task reads it
        own.add(run)
    seconds = data.duration_s if data.requests_per_level is None else None
    config = BenchConfig(
        url=backend.url,
        model=backend.model,
        concurrency=tuple(data.concurrency),
        requests_per_level=data.requests_per_level,
        duration_s=seconds,
        input_len=data.input_len,
        output_len=data.output_len,
    )
    fields = ("name", "model", "method", "k", "gpu_type", "gpu_count")
    described = {name: getattr(backend, name) for name in fields}
    services.loop.call_soon_threadsafe(services.benchmarks.start, run.id, config, described)
    return BenchmarkPublic.model_validate(run)


@router.get("")
def list_benchmarks(session: SessionDep) -> dict[str, Any]:
    """Runs, newest first."""
    rows = session.query(BenchmarkRun).order_by(BenchmarkRun.id.desc()).limit(100).all()
    return {"object": "list", "data": [BenchmarkPublic.model_validate(r) for r in rows]}


@router.get("/{run_id}")
def get_benchmark(run_id: int, session: SessionDep) -> BenchmarkPublic:
    """One run: status, progress, results."""
    row = session.get(BenchmarkRun, run_id)
    if row is None:
        raise NotFound(f"benchmark run {run_id} not found", param="run_id")
    return BenchmarkPublic.model_validate(row)


@router.delete("/{run_id}")
def cancel_benchmark(run_id: int, session: SessionDep, request: Request) -> BenchmarkPublic:
    """Cancel a run that is still going."""
    row = session.get(BenchmarkRun, run_id)
    if row is None:
        raise NotFound(f"benchmark run {run_id} not found", param="run_id")
    if row.status not in ("queued", "running"):
        raise Conflict(f"benchmark run {run_id} already {row.status}", code="not_running")
    services = get_services(request)
    services.loop.call_soon_threadsafe(services.benchmarks.cancel, run_id)
    return BenchmarkPublic.model_validate(row)
