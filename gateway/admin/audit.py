"""Admin API for the audit log: every change, newest first."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from gateway.db import queries
from gateway.deps import SessionDep
from gateway.schemas.resources import AuditPublic, ListOf

router = APIRouter(prefix="/audit", tags=["audit"])


@router.get("")
def list_audit(
    session: SessionDep,
    resource_type: str | None = None,
    resource_id: str | None = None,
    before_id: Annotated[int | None, Query(ge=1)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> ListOf[AuditPublic]:
    """Audit entries, newest first; page with `before_id` (the last id seen)."""
    rows = queries.list_audit(
        session,
        resource_type=resource_type,
        resource_id=resource_id,
        before_id=before_id,
        limit=limit,
    )
    return ListOf[AuditPublic](data=[AuditPublic.model_validate(r) for r in rows])
