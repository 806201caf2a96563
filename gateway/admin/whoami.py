"""Admin API: what the caller's token may do (the dashboard asks before it offers changes)."""

from __future__ import annotations

from fastapi import APIRouter

from gateway.deps import CallerDep
from gateway.schemas.resources import TokenScope

router = APIRouter(prefix="/whoami", tags=["auth"])


@router.get("")
def whoami(caller: CallerDep) -> TokenScope:
    """The scope of this request's token, and the name the audit log gives its changes."""
    return TokenScope(scope=caller.scope, actor=caller.actor)
