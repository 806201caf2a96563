"""GPU prices ($ per GPU-hour by GPU type and kind, with source and date): audited changes."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from gateway.db import queries
from gateway.db.tables import GpuPrice
from gateway.schemas.resources import PriceCreate, PricePublic, PriceUpdate
from gateway.services.changes import merged


def _snapshot(row: GpuPrice) -> dict[str, Any]:
    return PricePublic.model_validate(row).model_dump(mode="json")


def _audit(
    session: Session, actor: str, action: str, row: GpuPrice, before: dict[str, Any] | None
) -> None:
    after = None if action == "delete" else _snapshot(row)
    resource = ("gpu_price", f"{row.gpu_type}/{row.kind}")
    queries.record_audit(
        session, actor=actor, action=action, resource=resource, before=before, after=after
    )


def create_price(session: Session, data: PriceCreate, actor: str) -> GpuPrice:
    """Add the price of a GPU type and kind."""
    row = GpuPrice(**data.model_dump())
    queries.add(session, row, f"{data.kind} price for {data.gpu_type!r}")
    _audit(session, actor, "create", row, None)
    return row


def update_price(session: Session, price_id: int, patch: PriceUpdate, actor: str) -> GpuPrice:
    """Change a price's amount, source or date."""
    row = queries.get_price(session, price_id)
    before = _snapshot(row)
    new = merged(PriceCreate, {k: getattr(row, k) for k in PriceCreate.model_fields}, patch)
    for key in PriceUpdate.model_fields:
        setattr(row, key, getattr(new, key))
    session.flush()
    _audit(session, actor, "update", row, before)
    return row


def delete_price(session: Session, price_id: int, actor: str) -> None:
    """Remove a price."""
    row = queries.get_price(session, price_id)
    before = _snapshot(row)
    session.delete(row)
    session.flush()
    _audit(session, actor, "delete", row, before)
