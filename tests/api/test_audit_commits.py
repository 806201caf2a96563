"""`on_audit_commit`: every audit entry a transaction commits, once committed, and no other."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy.orm import Session, sessionmaker

from gateway.db import migrate, queries
from gateway.db.session import make_engine, make_sessionmaker, on_audit_commit, transaction
from gateway.db.tables import AuditEntry


@pytest.fixture
def sessions(database_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(database_url)
    try:
        migrate.upgrade(engine)
        yield make_sessionmaker(engine)
    finally:
        engine.dispose()


def audit(session: Session, resource_id: str) -> None:
    queries.record_audit(
        session, actor="test", action="create", resource=("model", resource_id), before=None,
        after={"name": resource_id},
    )  # fmt: skip


def test_committed_entries_are_passed_after_the_commit(sessions: sessionmaker[Session]) -> None:
    seen: list[tuple[str, bool]] = []

    def callback(entry: AuditEntry) -> None:
        with sessions() as other:  # committed: another connection reads it
            stored = other.get(AuditEntry, entry.id)
        seen.append((entry.resource_id, stored is not None))

    on_audit_commit(sessions, callback)
    with transaction(sessions) as session:
        audit(session, "a")
        audit(session, "b")
        assert seen == []  # flushed, not yet committed
    assert seen == [("a", True), ("b", True)]


def test_rolled_back_entries_are_never_passed(sessions: sessionmaker[Session]) -> None:
    seen: list[str] = []
    on_audit_commit(sessions, lambda entry: seen.append(entry.resource_id))

    def failing_request() -> None:
        with transaction(sessions) as session:
            audit(session, "gone")
            raise RuntimeError("the request failed after its change")

    with pytest.raises(RuntimeError):
        failing_request()
    with transaction(sessions) as session:
        audit(session, "kept")
        savepoint = session.begin_nested()
        audit(session, "undone")
        savepoint.rollback()
    assert seen == ["kept"]


def test_a_failing_callback_leaves_the_commit_standing(
    sessions: sessionmaker[Session], caplog: pytest.LogCaptureFixture
) -> None:
    def fail(entry: AuditEntry) -> None:
        raise ValueError("exporter broke")

    on_audit_commit(sessions, fail)
    with transaction(sessions) as session:
        audit(session, "still-there")
    with sessions() as session:
        assert [e.resource_id for e in queries.list_audit(session)] == ["still-there"]
    assert "audit callback failed" in caplog.text
