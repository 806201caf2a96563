"""The lease one gateway replica holds for all (pool discovery), on SQLite and PostgreSQL."""

from __future__ import annotations

import time

from sqlalchemy.orm import Session, sessionmaker

from gateway.db import migrate
from gateway.db.session import make_engine, make_sessionmaker, transaction
from gateway.services import leases


def _hold(sessions: sessionmaker[Session], holder: str, seconds: float) -> bool:
    with transaction(sessions) as session:
        return leases.hold(session, "job", holder, seconds)


def test_one_holder_at_a_time_until_it_lets_go_or_lapses(database_url: str) -> None:
    engine = make_engine(database_url)
    try:
        migrate.upgrade(engine)
        sessions = make_sessionmaker(engine)
        assert _hold(sessions, "a", 60)  # the first takes it
        assert not _hold(sessions, "b", 60)  # held
        assert _hold(sessions, "a", 60)  # and renewed by its holder
        with transaction(sessions) as session:
            leases.release(session, "job", "b")  # not b's to release
        assert not _hold(sessions, "b", 60)
        with transaction(sessions) as session:
            leases.release(session, "job", "a")
        assert _hold(sessions, "b", 0.3)  # let go: the next asks takes it
        assert not _hold(sessions, "a", 60)
        deadline = time.monotonic() + 30
        while not _hold(sessions, "a", 60):  # b stopped renewing: it lapses
            assert time.monotonic() < deadline, "the lease never lapsed"
            time.sleep(0.05)
        assert not _hold(sessions, "b", 60)
        with transaction(sessions) as session:
            assert abs(leases.clock(session) - time.time()) < 5  # the database's own clock
    finally:
        engine.dispose()
