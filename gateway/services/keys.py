"""Client API keys: created once with the secret shown, then only hashed; audited changes."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from gateway.apikeys import generate_key
from gateway.db import queries
from gateway.db.base import utcnow
from gateway.db.tables import ApiKey
from gateway.schemas.resources import KeyCreate, KeyCreated, KeyPublic, KeyUpdate
from gateway.services.changes import merged
from gateway.services.teams import check_team


def _snapshot(row: ApiKey) -> dict[str, Any]:
    return KeyPublic.model_validate(row).model_dump(mode="json")


def _audit(
    session: Session, actor: str, action: str, row: ApiKey, before: dict[str, Any] | None
) -> None:
    queries.record_audit(
        session,
        actor=actor,
        action=action,
        resource=("api_key", str(row.id)),
        before=before,
        after=_snapshot(row),
    )


def create_key(session: Session, data: KeyCreate, actor: str) -> KeyCreated:
    """Create a key; the returned object is the only place its secret appears."""
    check_team(session, data.team_id)
    new = generate_key()
    row = ApiKey(key_prefix=new.prefix, key_hash=new.sha256, **data.model_dump())
    queries.add(session, row, "API key")
    _audit(session, actor, "create", row, None)
    return KeyCreated(key=new.secret, **KeyPublic.model_validate(row).model_dump())


def update_key(session: Session, key_id: int, patch: KeyUpdate, actor: str) -> ApiKey:
    """Change a key's name or limits."""
    row = queries.get_key(session, key_id)
    before = _snapshot(row)
    new = merged(KeyCreate, {k: getattr(row, k) for k in KeyCreate.model_fields}, patch)
    check_team(session, new.team_id)
    for key, value in new.model_dump().items():
        setattr(row, key, value)
    session.flush()
    _audit(session, actor, "update", row, before)
    return row


def revoke_key(session: Session, key_id: int, actor: str) -> ApiKey:
    """Revoke a key; the row stays so its usage history keeps its owner."""
    row = queries.get_key(session, key_id)
    if row.revoked_at is None:
        before = _snapshot(row)
        row.revoked_at = utcnow()
        session.flush()
        _audit(session, actor, "revoke", row, before)
    return row
