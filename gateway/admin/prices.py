"""Admin API for GPU prices: $ per GPU-hour by GPU type and kind, with source and date."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response
from sqlalchemy.orm import Session

from gateway.db import queries
from gateway.db.tables import GpuPrice
from gateway.deps import SessionDep
from gateway.schemas import ListOf, PriceCreate, PricePublic, PriceUpdate
from gateway.services.changes import merged

router = APIRouter(prefix="/prices", tags=["prices"])
ACTOR = "admin-api"


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


@router.get("")
def list_prices(session: SessionDep, gpu_type: str | None = None) -> ListOf[PricePublic]:
    """Every GPU price, optionally of one GPU type."""
    rows = queries.list_prices(session, gpu_type)
    return ListOf[PricePublic](data=[PricePublic.model_validate(r) for r in rows])


@router.post("", status_code=201)
def post_price(data: PriceCreate, session: SessionDep) -> PricePublic:
    """Add a GPU price."""
    return PricePublic.model_validate(create_price(session, data, ACTOR))


@router.get("/{price_id}")
def get_price(price_id: int, session: SessionDep) -> PricePublic:
    """One GPU price."""
    return PricePublic.model_validate(queries.get_price(session, price_id))


@router.patch("/{price_id}")
def patch_price(price_id: int, patch: PriceUpdate, session: SessionDep) -> PricePublic:
    """Change a GPU price."""
    return PricePublic.model_validate(update_price(session, price_id, patch, ACTOR))


@router.delete("/{price_id}", status_code=204)
def remove_price(price_id: int, session: SessionDep) -> Response:
    """Remove a GPU price."""
    delete_price(session, price_id, ACTOR)
    return Response(status_code=204)
