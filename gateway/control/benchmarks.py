"""Benchmark runs in the background: a sweep against a backend, its progress and results.

Each run is a row in `benchmark_runs` (queued → running → succeeded | failed | cancelled):
the table is the queue. `POST /admin/v1/benchmarks` on any worker of any replica adds a
queued row; each replica's leader claims queued rows (a conditional update, so exactly one
leader gets each), runs them as asyncio tasks and beats a heartbeat on them every
`POLL_S`. `DELETE` marks a row cancelled wherever it lands, and the leader running it stops
it at its next poll. A row left running with a heartbeat older than `ORPHAN_AFTER_S` lost
its leader without a stop (a killed process): any leader marks it failed. A leader that
stops gracefully puts its runs back in the queue, for the next leader to run from the start.

Results become `bench` measurements of the backend's model, method, K and GPU, which the
planner and the auto policy then use.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import or_, select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from backends.bench import BenchConfig, LevelResult, run_sweep
from gateway.control.windows import above_ceiling
from gateway.db import queries
from gateway.db.base import utcnow
from gateway.db.session import transaction
from gateway.db.tables import BenchmarkRun, Measurement

logger = logging.getLogger(__name__)
POLL_S = 1.0  # how often a leader claims queued runs, beats its runs' heartbeats, sees cancels
ORPHAN_AFTER_S = 30.0  # a running row's heartbeat older than this: its leader is gone
ORPHANED = (
    f"the gateway worker running it stopped without a word (no heartbeat for "
    f"{ORPHAN_AFTER_S:g} s); start it again"
)
BACKEND_FIELDS = (
    "name", "model", "method", "k", "gpu_type", "gpu_count", "drafter", "engine_version"
)  # fmt: skip


def sweep_config(params: Mapping[str, Any], url: str, model: str) -> BenchConfig:
    """The sweep a run's stored (validated, resolved) parameters describe, against `url`."""
    seconds = params["duration_s"] if params["requests_per_level"] is None else None
    return BenchConfig(
        url=url,
        model=model,
        concurrency=tuple(params["concurrency"]),
        requests_per_level=params["requests_per_level"],
        requests_per_client=params["requests_per_client"],
        duration_s=seconds,
        input_len=params["input_len"],
        output_len=params["output_len"],
        rate_per_s=params["rate_per_s"],
        poisson=params["poisson"],
        burstiness=params["burstiness"] or 1.0,
        workload=params["workload"],
        seed=params["seed"],
        temperature=params["temperature"],
    )


@dataclass(frozen=True)
class Claimed:
    """A run this leader now owns: its sweep (with the backend's key) and the backend as it
    was when claimed, for the measurements; or why it cannot run."""

    run_id: int
    config: BenchConfig | None = None
    backend: dict[str, Any] = dataclasses.field(default_factory=dict)
    error: str | None = None


class BenchmarkManager:
    """Claims, runs and cancels a replica's benchmark runs (in its leader)."""

    def __init__(
        self, sessions: sessionmaker[Session], ceiling_margin: float | None = None
    ) -> None:
        self.sessions = sessions
        self.ceiling_margin = ceiling_margin  # levels faster than the hardware are not stored
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._stopping = False

    @property
    def running(self) -> list[int]:
        """The runs going on here, by id."""
        return sorted(run_id for run_id, task in self._tasks.items() if not task.done())

    async def run(self, stop: asyncio.Event) -> None:
        """Claim and run queued runs, every `POLL_S` until `stop`; then put back the runs
        still going, for the next leader."""
        try:
            while not stop.is_set():
                await self.poll()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), POLL_S)
        finally:
            await self.close()

    async def poll(self) -> None:
        """One turn: heartbeats, cancels, orphans, then new claims."""
        try:
            gone, claimed = await asyncio.to_thread(self._poll, self.running)
        except SQLAlchemyError as exc:  # the database is away: try again next turn
            logger.warning("benchmark queue unreachable: %s", type(exc).__name__)
            return
        for run_id in gone:  # cancelled (or given up on) elsewhere: stop it here
            self._tasks[run_id].cancel()
        for job in claimed:
            self._tasks[job.run_id] = asyncio.create_task(self._run(job))
        self._tasks = {i: t for i, t in self._tasks.items() if not t.done()}

    async def close(self) -> None:
        """Stop every run (at the stop) and wait until each is back in the queue."""
        self._stopping = True
        for task in self._tasks.values():
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        self._tasks.clear()

    def _poll(self, running: list[int]) -> tuple[list[int], list[Claimed]]:
        now = utcnow()
        with transaction(self.sessions) as session:
            mine = (BenchmarkRun.id.in_(running), BenchmarkRun.status == "running")
            still: set[int] = set()
            if running:
                session.execute(update(BenchmarkRun).where(*mine).values(heartbeat_at=now))
                still = set(session.scalars(select(BenchmarkRun.id).where(*mine)))
            gone = sorted(set(running) - still)
            stale = now - dt.timedelta(seconds=ORPHAN_AFTER_S)
            session.execute(
                update(BenchmarkRun)
                .where(
                    BenchmarkRun.status == "running",
                    BenchmarkRun.id.not_in(running),
                    or_(BenchmarkRun.heartbeat_at.is_(None), BenchmarkRun.heartbeat_at < stale),
                )
                .values(status="failed", error=ORPHANED, finished_at=now)
            )
        return gone, self._claim(now)

    def _claim(self, now: dt.datetime) -> list[Claimed]:
        """Every queued run this leader wins, each claimed in its own transaction."""
        with self.sessions() as session:
            queued = session.scalars(
                select(BenchmarkRun.id).where(BenchmarkRun.status == "queued")
            ).all()
        return [job for run_id in queued if (job := self._claim_one(run_id, now)) is not None]

    def _claim_one(self, run_id: int, now: dt.datetime) -> Claimed | None:
        with transaction(self.sessions) as session:
            won = session.execute(
                update(BenchmarkRun)
                .where(BenchmarkRun.id == run_id, BenchmarkRun.status == "queued")
                .values(status="running", started_at=now, heartbeat_at=now, progress=0.0)
            )
            if not won.rowcount:  # type: ignore[attr-defined]
                return None  # another leader's, or cancelled meanwhile
            row = session.get_one(BenchmarkRun, run_id)
            backend = queries.find_backend(session, row.backend_name or "")
            if backend is None:
                return Claimed(run_id, error=f"backend {row.backend_name!r} no longer exists")
            try:
                config = sweep_config(row.params, row.url, row.model)
            except (KeyError, TypeError, ValueError) as exc:  # a row no API call could write
                return Claimed(run_id, error=f"its parameters cannot be run: {exc!r}")
            described = {name: getattr(backend, name) for name in BACKEND_FIELDS}
            return Claimed(run_id, dataclasses.replace(config, api_key=backend.api_key), described)

    async def _run(self, job: Claimed) -> None:
        if job.config is None:
            await asyncio.to_thread(self._finish, job.run_id, "failed", [], {}, job.error)
            return
        config, total = job.config, len(job.config.concurrency)
        done: list[LevelResult] = []

        def report(_: str) -> None:  # progress lines are for terminals; we count levels
            pass

        try:
            for c in config.concurrency:
                level = dataclasses.replace(config, concurrency=(c,))
                done += await run_sweep(level, report)
                await asyncio.to_thread(self._progress, job.run_id, len(done) / total)
        except asyncio.CancelledError:
            if self._stopping:  # the leader stops: the next one runs it again, whole
                await asyncio.to_thread(self._requeue, job.run_id)
            else:
                await asyncio.to_thread(
                    self._finish, job.run_id, "cancelled", done, job.backend, None
                )
            raise
        except Exception as exc:  # the top of a background task: record, do not crash
            logger.exception("benchmark run %d failed", job.run_id)
            await asyncio.to_thread(self._finish, job.run_id, "failed", done, job.backend, str(exc))
            return
        await asyncio.to_thread(self._finish, job.run_id, "succeeded", done, job.backend, None)

    def _requeue(self, run_id: int) -> None:
        with transaction(self.sessions) as session:
            session.execute(
                update(BenchmarkRun)
                .where(BenchmarkRun.id == run_id, BenchmarkRun.status == "running")
                .values(status="queued", progress=0.0, started_at=None, heartbeat_at=None)
            )

    def _progress(self, run_id: int, progress: float) -> None:
        with transaction(self.sessions) as session:
            session.execute(
                update(BenchmarkRun)
                .where(BenchmarkRun.id == run_id, BenchmarkRun.status == "running")
                .values(progress=progress)
            )

    def _finish(
        self,
        run_id: int,
        status: str,
        levels: list[LevelResult],
        backend: dict[str, Any],
        error: str | None,
    ) -> None:
        """Record how the run ended and the levels it completed; a run cancelled (or given up
        on) meanwhile keeps that status."""
        result: dict[str, Any] = {"levels": [_level_json(level) for level in levels]}
        measured = []
        if backend.get("method") is not None:
            measured = [level_measurement(level, backend) for level in levels if level.completed]
        kept = [m for m in measured if not above_ceiling(m, self.ceiling_margin)]
        if len(kept) < len(measured):  # in the run's result, never among the measurements
            above = [m.concurrency for m in measured if m not in kept]
            result["above_ceiling"] = above
            logger.warning("run %d: levels at %s above the hardware's ceiling", run_id, above)
        with transaction(self.sessions) as session:
            row = session.get(BenchmarkRun, run_id)
            if row is None:
                return
            if row.status == "running":
                row.status, row.error, row.finished_at = status, error, utcnow()
            row.result, row.heartbeat_at = result, None
            session.add_all(kept)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _level_json(level: LevelResult) -> dict[str, Any]:
    return {
        "concurrency": level.concurrency,
        "completed": level.completed,
        "failed": level.failed,
        "duration_s": level.duration_s,
        "request_rate_per_s": level.request_rate_per_s,
        "achieved_request_rate_per_s": level.achieved_request_rate_per_s,
        "mean_in_flight": level.mean_in_flight,
        "output_tokens_per_s": level.output_tokens_per_s,
        "mean_ttft_ms": _mean(level.ttft_ms),
        "mean_tpot_ms": _mean(level.tpot_ms),  # per-token latency
        "mean_itl_ms": _mean(level.itl_ms),  # between streamed chunks
        "mean_e2e_ms": _mean(level.e2e_ms),
        "acceptance_length": level.acceptance_length,
        "acceptance_per_position": level.acceptance_per_position,
    }


def level_measurement(level: LevelResult, backend: dict[str, Any]) -> Measurement:
    """A sweep level as a `bench` measurement of the backend described, at the concurrency
    it really ran at (open-loop: the requests in flight on average, not the cap)."""
    figures = _level_json(level)
    return Measurement(
        model=backend["model"],
        method=backend["method"],
        k=backend.get("k") or 0,
        gpu_type=backend["gpu_type"],
        gpu_count=backend["gpu_count"],
        concurrency=level.load_concurrency,
        output_tokens_per_s=level.output_tokens_per_s,
        mean_acceptance_length=level.acceptance_length,
        acceptance_per_position=level.acceptance_per_position,
        ttft_ms=figures["mean_ttft_ms"],
        itl_ms=figures["mean_itl_ms"],
        source="bench",
        backend_name=backend.get("name"),
        drafter=backend.get("drafter"),
        engine_version=backend.get("engine_version"),
        requests=level.completed,
        mean_prompt_tokens=level.input_tokens / level.completed if level.completed else None,
        mean_output_tokens=level.output_tokens / level.completed if level.completed else None,
    )
