"""Benchmark runs as a queue in the database, on SQLite and the real PostgreSQL: each queued
run is claimed by exactly one replica's leader, a cancelled run stops where it runs, a run
whose leader died is given up on, and a leader that stops puts its runs back.

The sweeps go to a socket that accepts connections and never answers, so a claimed run stays
running until something stops it.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import socket
from collections.abc import Iterator

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from gateway.control.benchmarks import ORPHAN_AFTER_S, ORPHANED, BenchmarkManager
from gateway.db import migrate
from gateway.db.base import utcnow
from gateway.db.session import make_engine, make_sessionmaker, transaction
from gateway.db.tables import Backend, BenchmarkRun
from gateway.schemas.benchmarks import BenchmarkCreate

BACKEND = "silent"


@pytest.fixture
def silent_url() -> Iterator[str]:
    """A server that takes connections (the kernel's backlog) and never answers them."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


@pytest.fixture
def sessions(database_url: str, silent_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(database_url)
    migrate.upgrade(engine)
    factory = make_sessionmaker(engine)
    with transaction(factory) as session:
        session.add(Backend(name=BACKEND, url=silent_url, model="m", method="plain",
                            gpu_type="B200", gpu_count=1))  # fmt: skip
    yield factory
    engine.dispose()


def queue(sessions: sessionmaker[Session], count: int, backend: str = BACKEND) -> list[int]:
    """`count` queued runs, as `POST /admin/v1/benchmarks` writes them."""
    params = BenchmarkCreate(backend=backend, concurrency=[1, 2], duration_s=60).model_dump()
    with transaction(sessions) as session:
        url = session.scalars(select(Backend.url)).one()
        runs = [BenchmarkRun(model="m", url=url, backend_name=backend, params=params)
                for _ in range(count)]  # fmt: skip
        session.add_all(runs)
        session.flush()
        return [run.id for run in runs]


def rows(sessions: sessionmaker[Session]) -> dict[int, BenchmarkRun]:
    with sessions() as session:
        return {row.id: row for row in session.scalars(select(BenchmarkRun))}


async def until(condition: object, what: str, timeout_s: float = 10.0) -> None:
    """Poll `condition()` until true; fail naming `what` at the deadline."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, f"not within {timeout_s} s: {what}"
        await asyncio.sleep(0.05)


async def test_each_queued_run_is_claimed_by_one_leader_and_put_back_at_its_stop(
    sessions: sessionmaker[Session],
) -> None:
    ids = queue(sessions, 6)
    first, second = BenchmarkManager(sessions), BenchmarkManager(sessions)
    await asyncio.gather(first.poll(), second.poll())  # two replicas' leaders at once
    try:
        assert sorted(first.running + second.running) == ids
        assert not set(first.running) & set(second.running)
        assert {row.status for row in rows(sessions).values()} == {"running"}
        assert all(row.heartbeat_at is not None for row in rows(sessions).values())
        await first.poll()  # nothing left to claim
        await second.poll()
        assert sorted(first.running + second.running) == ids
    finally:
        await first.close()
        await second.close()
    back = rows(sessions).values()
    assert {(r.status, r.progress, r.started_at, r.heartbeat_at) for r in back} == {
        ("queued", 0.0, None, None)
    }


async def test_a_run_cancelled_anywhere_stops_where_it_runs(
    sessions: sessionmaker[Session],
) -> None:
    [run_id] = queue(sessions, 1)
    leader = BenchmarkManager(sessions)
    try:
        await leader.poll()
        assert leader.running == [run_id]
        with transaction(sessions) as session:  # what DELETE does, on any worker or replica
            session.execute(update(BenchmarkRun).values(status="cancelled"))
        await leader.poll()
        await until(lambda: not leader.running, "the leader stopped the run")
        await until(lambda: rows(sessions)[run_id].result is not None, "the run was recorded")
    finally:
        await leader.close()
    row = rows(sessions)[run_id]
    assert (row.status, row.result, row.heartbeat_at) == ("cancelled", {"levels": []}, None)


async def test_a_run_whose_leader_died_is_failed_and_a_live_ones_run_kept(
    sessions: sessionmaker[Session],
) -> None:
    alive, dead = queue(sessions, 2)
    beat = utcnow() - dt.timedelta(seconds=ORPHAN_AFTER_S + 1)
    with transaction(sessions) as session:  # a leader killed mid-run, 31 s ago
        session.execute(update(BenchmarkRun).where(BenchmarkRun.id == dead)
                        .values(status="running", started_at=beat, heartbeat_at=beat))  # fmt: skip
    leader, other = BenchmarkManager(sessions), BenchmarkManager(sessions)
    try:
        await leader.poll()
        assert leader.running == [alive]
        await other.poll()  # the live leader's fresh heartbeat keeps its run
        assert other.running == []
        found = rows(sessions)
        assert (found[dead].status, found[dead].error) == ("failed", ORPHANED)
        assert found[dead].finished_at is not None
        assert found[alive].status == "running"
    finally:
        await leader.close()
        await other.close()


async def test_a_run_whose_backend_was_removed_fails_saying_so(
    sessions: sessionmaker[Session],
) -> None:
    [run_id] = queue(sessions, 1, backend="removed")
    leader = BenchmarkManager(sessions)
    try:
        await leader.poll()
        await until(lambda: rows(sessions)[run_id].status == "failed", "the run failed")
    finally:
        await leader.close()
    assert rows(sessions)[run_id].error == "backend 'removed' no longer exists"
