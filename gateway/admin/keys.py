"""Admin API for client API keys: created once with the secret shown, then only hashed."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from sqlalchemy.orm import Session

from gateway.apikeys import generate_key
from gateway.db import queries
from gateway.db.base import utcnow
from gateway.db.tables import ApiKey
from gateway.deps import SessionDep
from gateway.schemas import KeyCreate, KeyCreated, KeyPublic, KeyUpdate, ListOf
from gateway.services.changes import merged

router = APIRouter(prefix="/keys", tags=["keys"])
ACTOR = "admin-api"


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


@router.get("")
def list_keys(session: SessionDep, include_revoked: bool = False) -> ListOf[KeyPublic]:
    """API keys, newest first; revoked ones only when asked."""
    rows = queries.list_keys(session, include_revoked)
    return ListOf[KeyPublic](data=[KeyPublic.model_validate(r) for r in rows])


@router.post("", status_code=201)
def post_key(data: KeyCreate, session: SessionDep) -> KeyCreated:
    """Create an API key; the response shows the key once."""
    return create_key(session, data, ACTOR)


@router.get("/{key_id}")
def get_key(key_id: int, session: SessionDep) -> KeyPublic:
    """One API key (never its secret)."""
    return KeyPublic.model_validate(queries.get_key(session, key_id))


@router.patch("/{key_id}")
def patch_key(key_id: int, patch: KeyUpdate, session: SessionDep) -> KeyPublic:
    """Change an API key's name or limits."""
    return KeyPublic.model_validate(update_key(session, key_id, patch, ACTOR))


@router.delete("/{key_id}")
def delete_key(key_id: int, session: SessionDep) -> KeyPublic:
    """Revoke an API key (the record is kept for usage history)."""
    return KeyPublic.model_validate(revoke_key(session, key_id, ACTOR))
