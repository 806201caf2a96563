"""Benchmark runs in the background: a sweep against a backend, its progress and results.

Each run is a row in `benchmark_runs` (queued → running → succeeded | failed | cancelled) and
an asyncio task here; results become `bench` measurements of the backend's model, method, K
and GPU, which the planner and the auto policy then use.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from backends.bench import BenchConfig, LevelResult, run_sweep
from gateway.db.base import utcnow
from gateway.db.session import transaction
from gateway.db.tables import BenchmarkRun, Measurement

logger = logging.getLogger(__name__)


class BenchmarkManager:
    """Starts, tracks and cancels benchmark runs."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self.sessions = sessions
        self._tasks: dict[int, asyncio.Task[None]] = {}

    def start(self, run_id: int, config: BenchConfig, backend: dict[str, Any]) -> None:
        """Run the sweep of `run_id` in the background."""
        self._tasks[run_id] = asyncio.create_task(self._run(run_id, config, backend))

    def cancel(self, run_id: int) -> bool:
        """Cancel a run in progress; False when it is not running here."""
        task = self._tasks.get(run_id)
        if task is None or task.done():
            return False
        task.cancel()
        return True

    async def close(self) -> None:
        """Cancel every run (at shutdown) and wait for them to record it."""
        for task in self._tasks.values():
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    async def _run(self, run_id: int, config: BenchConfig, backend: dict[str, Any]) -> None:
        total = len(config.concurrency)
        done: list[LevelResult] = []

        def report(_: str) -> None:  # progress lines are for terminals; we count levels
            pass

        await asyncio.to_thread(self._update, run_id, status="running", started_at=utcnow())
        try:
            for c in config.concurrency:
                level = dataclasses.replace(config, concurrency=(c,))
                done += await run_sweep(level, report)
                await asyncio.to_thread(self._update, run_id, progress=len(done) / total)
        except asyncio.CancelledError:
            await asyncio.to_thread(self._finish, run_id, "cancelled", done, backend, None)
            raise
        except Exception as exc:  # the top of a background task: record, do not crash
            logger.exception("benchmark run %d failed", run_id)
            await asyncio.to_thread(self._finish, run_id, "failed", done, backend, str(exc))
            return
        await asyncio.to_thread(self._finish, run_id, "succeeded", done, backend, None)

    def _update(self, run_id: int, **fields: Any) -> None:
        with transaction(self.sessions) as session:
            row = session.get(BenchmarkRun, run_id)
            if row is not None:
                for key, value in fields.items():
                    setattr(row, key, value)

    def _finish(
        self,
        run_id: int,
        status: str,
        levels: list[LevelResult],
        backend: dict[str, Any],
        error: str | None,
    ) -> None:
        result = {"levels": [_level_json(level) for level in levels]}
        with transaction(self.sessions) as session:
            row = session.get(BenchmarkRun, run_id)
            if row is None:
                return
            row.status, row.result, row.error, row.finished_at = status, result, error, utcnow()
            if backend.get("method") is not None:
                session.add_all(
                    level_measurement(level, backend) for level in levels if level.completed
                )


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
        requests=level.completed,
        mean_prompt_tokens=level.input_tokens / level.completed if level.completed else None,
        mean_output_tokens=level.output_tokens / level.completed if level.completed else None,
    )
