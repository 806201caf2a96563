"""Admin API: what the caller's token may do (the dashboard asks before it offers changes)."""

from __future__ import annotations

from fastapi import APIRouter

from gateway.deps import CallerDep
from gateway.schemas.resources import TokenScope

router = APIRouter(prefix="/whoami", tags=["auth"])


@router.get("")
def whoami(caller: CallerDep) -> TokenScope:
    """The scope of the token this request carries, and the name its changes are audited
    under."""
    return TokenScope(scope=caller.scope, actor=caller.actor)
