"""`fleet.yaml`: backends, pools, models with policies, and GPU prices, declared and applied
at start."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import Field, ValidationError
from sqlalchemy import text
from sqlalchemy.orm import Session

from gateway.db import queries
from gateway.schemas.resources import (
    BackendCreate,
    BackendUpdate,
    Name,
    Policy,
    PoolCreate,
    PriceCreate,
    PriceUpdate,
    Strict,
)
from gateway.services.backends import create_backend, update_backend
from gateway.services.models import set_policy
from gateway.services.pools import apply_pool
from gateway.services.prices import create_price, update_price

ACTOR = "fleet"
# Any constant works; replicas applying the fleet together must agree on it.
_FLEET_LOCK_ID = 0x6472_6166_7466  # "draftf"


class FleetError(ValueError):
    """A fleet file that cannot be read or does not validate."""


class FleetModel(Strict):
    """A model and its policy as declared in the fleet file."""

    name: Name
    policy: Policy = Field(default_factory=Policy)


class Fleet(Strict):
    """The whole fleet file."""

    backends: list[BackendCreate] = Field(default_factory=list)
    pools: list[PoolCreate] = Field(default_factory=list)
    models: list[FleetModel] = Field(default_factory=list)
    prices: list[PriceCreate] = Field(default_factory=list)


def load_fleet(path: Path) -> Fleet:
    """Read and validate a fleet file, naming the file and field on error."""
    try:
        document = yaml.safe_load(path.read_text()) or {}
        return Fleet.model_validate(document)
    except OSError as exc:
        raise FleetError(f"cannot read fleet file {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise FleetError(f"fleet file {path} is not valid YAML: {exc}") from exc
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise FleetError(f"fleet file {path}: {where}: {first['msg']}") from exc


def apply_fleet(session: Session, fleet: Fleet, *, allow_link_local: bool = False) -> None:
    """Create or update what the fleet declares; what it does not mention is left alone.

    On PostgreSQL, replicas starting together take turns (a lock held until the caller's
    transaction ends), so the second finds the first's rows instead of a conflict.
    """
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": _FLEET_LOCK_ID})
    for model in fleet.models:
        set_policy(session, model.name, model.policy, ACTOR)
    for backend in fleet.backends:
        _apply_backend(session, backend, allow_link_local)
    for pool in fleet.pools:
        apply_pool(session, pool, ACTOR)
    for price in fleet.prices:
        _apply_price(session, price)


def _apply_backend(session: Session, backend: BackendCreate, allow_link_local: bool) -> None:
    if queries.find_backend(session, backend.name) is None:
        create_backend(session, backend, ACTOR, allow_link_local=allow_link_local)
        return
    fields = BackendUpdate.model_validate(backend.model_dump(mode="json", exclude={"name"}))
    update_backend(session, backend.name, fields, ACTOR, allow_link_local=allow_link_local)


def _apply_price(session: Session, price: PriceCreate) -> None:
    row = queries.find_price(session, price.gpu_type, price.kind)
    if row is None:
        create_price(session, price, ACTOR)
        return
    patch = PriceUpdate.model_validate(price.model_dump(exclude={"gpu_type", "kind"}))
    update_price(session, row.id, patch, ACTOR)
