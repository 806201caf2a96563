"""Admin API for pools: backends found by DNS, one per address (docs/fleet.md `pools[]`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Response
from sqlalchemy import select

from gateway.db.tables import Pool
from gateway.deps import ActorDep, SessionDep
from gateway.schemas.resources import POOL_NAME, ListOf, PoolCreate, PoolFields, PoolPublic
from gateway.services.pools import apply_pool, delete_pool, get_pool, pool_public

router = APIRouter(prefix="/pools", tags=["pools"])


@router.get("")
def list_pools(session: SessionDep) -> ListOf[PoolPublic]:
    """Every pool, with its members."""
    rows = session.scalars(select(Pool).order_by(Pool.name))
    return ListOf[PoolPublic](data=[pool_public(session, r) for r in rows])


@router.get("/{name}")
def read_pool(name: str, session: SessionDep) -> PoolPublic:
    """One pool, with its members."""
    return pool_public(session, get_pool(session, name))


@router.put("/{name}")
def put_pool(
    name: Annotated[str, Path(max_length=100, pattern=POOL_NAME)],
    data: PoolFields,
    session: SessionDep,
    actor: ActorDep,
) -> PoolPublic:
    """Create or replace a pool: its members take its new fields at once, and its DNS name
    is resolved at discovery's next round."""
    row = apply_pool(session, PoolCreate(name=name, **data.model_dump()), actor)
    return pool_public(session, row)


@router.delete("/{name}", status_code=204)
def remove_pool(name: str, session: SessionDep, actor: ActorDep) -> Response:
    """Remove a pool and its members: no new requests go to them, those in flight finish."""
    delete_pool(session, name, actor)
    return Response(status_code=204)
