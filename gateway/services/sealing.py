"""Backend API keys sealed at start (gateway/db/sealed.py): those stored as given, before a
secrets key was set, or under a key that no longer seals, are sealed again under the first."""

from __future__ import annotations

from sqlalchemy import Text, select, type_coerce, update
from sqlalchemy.orm import Session

from gateway.db.sealed import PREFIX, seal, sealing, stale, unseal
from gateway.db.tables import Backend, Pool


def seal_stored_keys(session: Session) -> int:
    """Seal every stale backend and pool-template key; how many were. SealedWithoutKey,
    before the gateway serves, when a stored key opens under none of the configured keys."""
    stored = type_coerce(Backend.api_key, Text)  # as stored: not opened
    sealed = 0
    for backend_id, raw in session.execute(select(Backend.id, stored).where(stored.is_not(None))):
        opened = unseal(raw)
        if stale(raw):
            session.execute(update(Backend).where(Backend.id == backend_id).values(api_key=opened))
            sealed += 1
    for pool in session.scalars(select(Pool)):
        kept = pool.template.get("api_key")
        opened = unseal(kept)
        if stale(kept):
            pool.template = {**pool.template, "api_key": seal(opened)}
            sealed += 1
    return sealed


def unsealed_keys(session: Session) -> int:
    """Backends whose key is stored as given (none while keys seal)."""
    if sealing():
        return 0
    stored = type_coerce(Backend.api_key, Text)
    found = session.scalars(select(stored).where(stored.is_not(None)))
    return sum(1 for raw in found if not raw.startswith(PREFIX))
