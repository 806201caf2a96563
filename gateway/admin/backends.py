"""Admin API for backends: the vLLM servers behind the gateway."""

from __future__ import annotations

from fastapi import APIRouter, Response

from gateway.db import queries
from gateway.db.measurements import latest_acceptance
from gateway.deps import ActorDep, ComponentsDep, SessionDep
from gateway.schemas.resources import (
    BackendCreate,
    BackendPublic,
    BackendUpdate,
    ListOf,
)
from gateway.services.backends import (
    backend_public,
    create_backend,
    delete_backend,
    update_backend,
    with_runtime,
)

router = APIRouter(prefix="/backends", tags=["backends"])


@router.get("")
def list_backends(
    session: SessionDep, components: ComponentsDep, model: str | None = None
) -> ListOf[BackendPublic]:
    """Every backend, optionally of one model, with this replica's view of each."""
    rows = queries.list_backends(session, model)
    measured = latest_acceptance(session, rows)
    return ListOf[BackendPublic](
        data=[with_runtime(row, components.registry, measured) for row in rows]
    )


@router.post("", status_code=201)
def post_backend(
    data: BackendCreate,
    session: SessionDep,
    components: ComponentsDep,
    actor: ActorDep,
) -> BackendPublic:
    """Add a backend."""
    allow = components.settings.allow_link_local_backends
    return backend_public(create_backend(session, data, actor, allow_link_local=allow))


@router.get("/{name}")
def get_backend(name: str, session: SessionDep, components: ComponentsDep) -> BackendPublic:
    """One backend, with this replica's view of it."""
    row = queries.get_backend(session, name)
    return with_runtime(row, components.registry, latest_acceptance(session, [row]))


@router.patch("/{name}")
def patch_backend(
    name: str,
    patch: BackendUpdate,
    session: SessionDep,
    components: ComponentsDep,
    actor: ActorDep,
) -> BackendPublic:
    """Change some fields of a backend (enable, disable, move, re-tune)."""
    allow = components.settings.allow_link_local_backends
    return backend_public(update_backend(session, name, patch, actor, allow_link_local=allow))


@router.delete("/{name}", status_code=204)
def remove_backend(name: str, session: SessionDep, actor: ActorDep) -> Response:
    """Remove a backend."""
    delete_backend(session, name, actor)
    return Response(status_code=204)
