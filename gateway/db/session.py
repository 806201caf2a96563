"""Engines and sessions; created by the app's lifespan or the CLI, never at import."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, inspect
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, SessionTransaction, sessionmaker

from gateway.db.tables import AuditEntry
from gateway.server.private import open_private, private_file

logger = logging.getLogger(__name__)

AUDIT_PENDING = "draftgate.audit_pending"  # session.info: audit entries flushed, not committed
# Seconds to open a PostgreSQL connection. libpq waits forever by default, so a database
# host that stopped answering would hang admin calls and /ready instead of a quick 503.
POSTGRES_CONNECT_TIMEOUT_S = 5


def _ensure_sqlite_dir(url: str) -> None:
    """Create the directory of a SQLite file so a fresh checkout just works, and the file
    owner-only (0600: it holds usage, keys' hashes and backend keys); SQLite gives its
    journal and WAL files the database's mode."""
    database = make_url(url).database
    if database and database != ":memory:" and not database.startswith("file:"):
        path = Path(database)
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.close(open_private(path, os.O_RDWR | os.O_CREAT | os.O_EXCL))
        for each in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
            with contextlib.suppress(FileNotFoundError):
                private_file(each)


def _sqlite_pragmas(dbapi_connection: Any, _: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=5000")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def make_engine(url: str, **kwargs: Any) -> Engine:
    """Create an engine; PostgreSQL gets a connect timeout, SQLite foreign keys, a busy
    timeout and WAL with `synchronous=NORMAL` (no fsync per commit: a crashed process loses
    no committed row, a power cut may lose the last ones; SQLite is the single-host default)."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "postgresql" and "connect_timeout" not in parsed.query:
        connect_args = kwargs.setdefault("connect_args", {})  # a URL's own setting wins
        connect_args.setdefault("connect_timeout", POSTGRES_CONNECT_TIMEOUT_S)
    if parsed.get_backend_name() != "sqlite":
        return create_engine(url, pool_pre_ping=True, **kwargs)
    _ensure_sqlite_dir(url)
    # No prepared-statement cache: the ledger's multi-row inserts differ in text by their
    # row count, so the driver's cache (128 per connection) filled with large statements and
    # the gateway grew about 2.7 KB per request for minutes on end (flat on PostgreSQL, whose
    # driver keeps none). A request reads SQLite at most once (a stored response's home not
    # in memory), a small statement: preparing each again costs microseconds.
    kwargs.setdefault("connect_args", {}).setdefault("cached_statements", 0)
    engine = create_engine(url, **kwargs)
    event.listen(engine, "connect", _sqlite_pragmas)
    return engine


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    """A session factory whose objects stay readable after commit."""
    return sessionmaker(engine, expire_on_commit=False)


def on_audit_commit(factory: sessionmaker[Session], callback: Callable[[AuditEntry], None]) -> None:
    """Call `callback` with every audit entry a session of `factory` commits, once committed
    (an entry rolled back, with its savepoint or its transaction, is never passed). A failing
    callback is logged; the commit stands."""

    def flushed(session: Session, _: Any) -> None:
        entries = [e for e in session.new if isinstance(e, AuditEntry)]
        if entries:
            session.info.setdefault(AUDIT_PENDING, []).extend(entries)

    def committed(session: Session) -> None:
        for entry in session.info.pop(AUDIT_PENDING, ()):
            if not inspect(entry).persistent:  # its savepoint was rolled back
                continue
            try:
                callback(entry)
            except Exception:  # after the commit: nothing to undo, and the change stands
                logger.exception("audit callback failed for entry %s", entry.id)

    def ended(session: Session, transaction: SessionTransaction) -> None:
        if transaction.parent is None:  # the outermost: committed and passed on, or rolled back
            session.info.pop(AUDIT_PENDING, None)

    event.listen(factory, "after_flush", flushed)
    event.listen(factory, "after_commit", committed)
    event.listen(factory, "after_transaction_end", ended)


@contextmanager
def transaction(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A session that commits on success and rolls back on error."""
    with factory() as session, session.begin():
        yield session


def upsert_insert(session: Session, table: Any) -> Any:
    """The dialect's INSERT, which knows ON CONFLICT (SQLite and PostgreSQL alike)."""
    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    return dialect.insert(table)
