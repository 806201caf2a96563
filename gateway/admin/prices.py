"""Admin API for GPU prices: $ per GPU-hour by GPU type and kind, with source and date."""

from __future__ import annotations

from fastapi import APIRouter, Response

from gateway.db import queries
from gateway.deps import ActorDep, SessionDep
from gateway.schemas.resources import ListOf, PriceCreate, PricePublic, PriceUpdate
from gateway.services.prices import create_price, delete_price, update_price

router = APIRouter(prefix="/prices", tags=["prices"])


@router.get("")
def list_prices(session: SessionDep, gpu_type: str | None = None) -> ListOf[PricePublic]:
    """Every GPU price, optionally of one GPU type."""
    rows = queries.list_prices(session, gpu_type)
    return ListOf[PricePublic](data=[PricePublic.model_validate(r) for r in rows])


@router.post("", status_code=201)
def post_price(data: PriceCreate, session: SessionDep, actor: ActorDep) -> PricePublic:
    """Add a GPU price."""
    return PricePublic.model_validate(create_price(session, data, actor))


@router.get("/{price_id}")
def get_price(price_id: int, session: SessionDep) -> PricePublic:
    """One GPU price."""
    return PricePublic.model_validate(queries.get_price(session, price_id))


@router.patch("/{price_id}")
def patch_price(
    price_id: int, patch: PriceUpdate, session: SessionDep, actor: ActorDep
) -> PricePublic:
    """Change a GPU price."""
    return PricePublic.model_validate(update_price(session, price_id, patch, actor))


@router.delete("/{price_id}", status_code=204)
def remove_price(price_id: int, session: SessionDep, actor: ActorDep) -> Response:
    """Remove a GPU price."""
    delete_price(session, price_id, actor)
    return Response(status_code=204)
