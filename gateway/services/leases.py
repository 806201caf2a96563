"""Leases: a job that one gateway replica does for all, held for a time and renewed.

Pool discovery is one: every replica watches the same sources, but two watches see a change
at different moments, and a replica whose view lags would undo what a fresher one just did
(remove the member it re-added, then add it back). So one replica holds the `discovery`
lease and applies what it finds; the others read the members from the database like any
change, and take the lease over when its holder lets it go (a graceful stop) or stops
renewing it (a crash, a partition) for the lease's time.

Times are the database's clock, never a replica's: replicas on different machines agree on
when a lease ends whatever their own clocks say.
"""

from __future__ import annotations

from sqlalchemy import or_, text, update
from sqlalchemy.orm import Session

from gateway.db.session import upsert_insert
from gateway.db.tables import Lease

DISCOVERY = "discovery"


def hold(session: Session, name: str, holder: str, seconds: float) -> bool:
    """Take or renew the lease `name` for `seconds` from now; whether `holder` holds it."""
    now = clock(session)
    held = session.execute(
        update(Lease)
        .where(Lease.name == name, or_(Lease.holder == holder, Lease.expires_at < now))
        .values(holder=holder, expires_at=now + seconds)
    )
    if held.rowcount:  # type: ignore[attr-defined]
        return True
    first = (  # the lease's first holder, unless another replica was first by a moment
        upsert_insert(session, Lease)
        .values(name=name, holder=holder, expires_at=now + seconds)
        .on_conflict_do_nothing(index_elements=["name"])
        .returning(Lease.name)
    )
    return session.execute(first).scalar_one_or_none() is not None


def release(session: Session, name: str, holder: str) -> None:
    """Let the lease go now, if `holder` holds it: another replica takes it at its next try."""
    session.execute(
        update(Lease).where(Lease.name == name, Lease.holder == holder).values(expires_at=0.0)
    )


def clock(session: Session) -> float:
    """The database's time, in seconds since the epoch."""
    if session.get_bind().dialect.name == "postgresql":
        query = "SELECT extract(epoch FROM clock_timestamp())"
    else:  # SQLite: every replica on the one machine that holds the file
        query = "SELECT (julianday('now') - 2440587.5) * 86400.0"
    return float(session.execute(text(query)).scalar_one())
