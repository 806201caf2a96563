"""Admin API for client API keys: created once with the secret shown, then only hashed."""

from __future__ import annotations

from fastapi import APIRouter

from gateway.db import queries
from gateway.deps import ActorDep, SessionDep
from gateway.schemas.resources import KeyCreate, KeyCreated, KeyPublic, KeyUpdate, ListOf
from gateway.services.keys import create_key, revoke_key, update_key

router = APIRouter(prefix="/keys", tags=["keys"])


@router.get("")
def list_keys(session: SessionDep, include_revoked: bool = False) -> ListOf[KeyPublic]:
    """API keys, newest first; revoked ones only when asked."""
    rows = queries.list_keys(session, include_revoked)
    return ListOf[KeyPublic](data=[KeyPublic.model_validate(r) for r in rows])


@router.post("", status_code=201)
def post_key(data: KeyCreate, session: SessionDep, actor: ActorDep) -> KeyCreated:
    """Create an API key; the response shows the key once."""
    return create_key(session, data, actor)


@router.get("/{key_id}")
def get_key(key_id: int, session: SessionDep) -> KeyPublic:
    """One API key (never its secret)."""
    return KeyPublic.model_validate(queries.get_key(session, key_id))


@router.patch("/{key_id}")
def patch_key(key_id: int, patch: KeyUpdate, session: SessionDep, actor: ActorDep) -> KeyPublic:
    """Change an API key's name or limits."""
    return KeyPublic.model_validate(update_key(session, key_id, patch, actor))


@router.delete("/{key_id}")
def delete_key(key_id: int, session: SessionDep, actor: ActorDep) -> KeyPublic:
    """Revoke an API key (the record is kept for usage history)."""
    return KeyPublic.model_validate(revoke_key(session, key_id, actor))
