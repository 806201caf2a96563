"""Admin API for backends: the vLLM servers behind the gateway."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Response
from sqlalchemy.orm import Session

from backends.methods import render_speculative_config
from gateway.admin.changes import merged
from gateway.admin.models import ensure_model
from gateway.admin.schemas import (
    BackendCreate,
    BackendFields,
    BackendPublic,
    BackendRuntime,
    BackendUpdate,
    ListOf,
)
from gateway.db import queries
from gateway.db.tables import Backend
from gateway.deps import ServicesDep, SessionDep
from gateway.registry import Registry

router = APIRouter(prefix="/backends", tags=["backends"])
ACTOR = "admin-api"


def backend_public(row: Backend) -> BackendPublic:
    """A backend as the API shows it, with its rendered vLLM speculative config."""
    public = BackendPublic.model_validate(row)
    fields = BackendFields.model_validate(_fields(row))
    public.speculative_config = render_speculative_config(fields.method_spec())
    return public


def _fields(row: Backend) -> dict[str, Any]:
    keys = BackendFields.model_fields.keys()
    return {key: getattr(row, key) for key in keys}


def _snapshot(row: Backend) -> dict[str, Any]:
    return backend_public(row).model_dump(mode="json")


def _assign(row: Backend, fields: BackendFields) -> None:
    for key in BackendFields.model_fields:
        setattr(row, key, getattr(fields, key))
    row.url = fields.normalised_url()


def create_backend(session: Session, data: BackendCreate, actor: str) -> Backend:
    """Add a backend (and its model, if new)."""
    row = Backend(name=data.name)
    _assign(row, data)
    queries.add(session, row, f"backend {data.name!r}")
    ensure_model(session, data.model, actor)
    queries.record_audit(
        session,
        actor=actor,
        action="create",
        resource=("backend", row.name),
        before=None,
        after=_snapshot(row),
    )
    return row


def update_backend(session: Session, name: str, patch: BackendUpdate, actor: str) -> Backend:
    """Change some fields of a backend, validating the result as a whole."""
    row = queries.get_backend(session, name)
    before = _snapshot(row)
    _assign(row, merged(BackendFields, _fields(row), patch))
    queries.flush(session, f"backend {name!r}")
    ensure_model(session, row.model, actor)
    queries.record_audit(
        session,
        actor=actor,
        action="update",
        resource=("backend", name),
        before=before,
        after=_snapshot(row),
    )
    return row


def delete_backend(session: Session, name: str, actor: str) -> None:
    """Remove a backend."""
    row = queries.get_backend(session, name)
    before = _snapshot(row)
    session.delete(row)
    session.flush()
    queries.record_audit(
        session, actor=actor, action="delete", resource=("backend", name), before=before, after=None
    )


def with_runtime(row: Backend, registry: Registry) -> BackendPublic:
    """The backend with what this replica sees of it now (health, load, mismatch)."""
    public = backend_public(row)
    state = registry.states.get(row.name)
    if state is not None and row.enabled:
        public.runtime = BackendRuntime(
            healthy=state.healthy, circuit_open=state.open_until > time.monotonic(),
            in_flight=state.in_flight, waiting=state.waiting, kv_cache_usage=state.kv_usage,
            method_mismatch=state.mismatch,
        )  # fmt: skip
    return public


@router.get("")
def list_backends(
    session: SessionDep, services: ServicesDep, model: str | None = None
) -> ListOf[BackendPublic]:
    """Every backend, optionally of one model, with this replica's view of each."""
    rows = queries.list_backends(session, model)
    return ListOf[BackendPublic](data=[with_runtime(row, services.registry) for row in rows])


@router.post("", status_code=201)
def post_backend(data: BackendCreate, session: SessionDep) -> BackendPublic:
    """Add a backend."""
    return backend_public(create_backend(session, data, ACTOR))


@router.get("/{name}")
def get_backend(name: str, session: SessionDep, services: ServicesDep) -> BackendPublic:
    """One backend, with this replica's view of it."""
    return with_runtime(queries.get_backend(session, name), services.registry)


@router.patch("/{name}")
def patch_backend(name: str, patch: BackendUpdate, session: SessionDep) -> BackendPublic:
    """Change some fields of a backend (enable, disable, move, re-tune)."""
    return backend_public(update_backend(session, name, patch, ACTOR))


@router.delete("/{name}", status_code=204)
def remove_backend(name: str, session: SessionDep) -> Response:
    """Remove a backend."""
    delete_backend(session, name, ACTOR)
    return Response(status_code=204)
