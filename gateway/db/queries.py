"""Query functions: each flushes and leaves commit to the caller's transaction."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gateway.db.base import Base
from gateway.db.tables import ApiKey, AuditEntry, Backend, GpuPrice, ModelPolicy
from gateway.errors import Conflict, NotFound

RowT = TypeVar("RowT", bound=Base)


def add(session: Session, row: RowT, what: str) -> RowT:
    """Insert a row; a unique-key clash becomes `Conflict` naming `what`."""
    session.add(row)
    flush(session, what)
    return row


def flush(session: Session, what: str) -> None:
    """Flush pending changes; a unique-key clash becomes `Conflict` naming `what`."""
    try:
        with session.begin_nested():
            session.flush()
    except IntegrityError as exc:
        raise Conflict(f"{what} already exists") from exc


def find_backend(session: Session, name: str) -> Backend | None:
    """The backend called `name`, if it exists."""
    return session.scalar(select(Backend).where(Backend.name == name))


def get_backend(session: Session, name: str) -> Backend:
    """The backend called `name`."""
    row = find_backend(session, name)
    if row is None:
        raise NotFound(f"backend {name!r} not found", param="name")
    return row


def list_backends(session: Session, model: str | None = None) -> Sequence[Backend]:
    """Every backend, optionally of one model, by name."""
    query = select(Backend).order_by(Backend.name)
    if model is not None:
        query = query.where(Backend.model == model)
    return session.scalars(query).all()


def find_model(session: Session, name: str) -> ModelPolicy | None:
    """The model called `name`, if it exists."""
    return session.scalar(select(ModelPolicy).where(ModelPolicy.name == name))


def get_model(session: Session, name: str) -> ModelPolicy:
    """The model called `name`."""
    row = find_model(session, name)
    if row is None:
        raise NotFound(f"model {name!r} not found", param="model")
    return row


def list_models(session: Session) -> Sequence[ModelPolicy]:
    """Every model, by name."""
    return session.scalars(select(ModelPolicy).order_by(ModelPolicy.name)).all()


def get_price(session: Session, price_id: int) -> GpuPrice:
    """The GPU price with this id."""
    row = session.get(GpuPrice, price_id)
    if row is None:
        raise NotFound(f"GPU price {price_id} not found", param="price_id")
    return row


def find_price(session: Session, gpu_type: str, kind: str) -> GpuPrice | None:
    """The price of `gpu_type` of this kind, if set."""
    query = select(GpuPrice).where(GpuPrice.gpu_type == gpu_type, GpuPrice.kind == kind)
    return session.scalar(query)


def list_prices(session: Session, gpu_type: str | None = None) -> Sequence[GpuPrice]:
    """Every GPU price, optionally of one GPU type."""
    query = select(GpuPrice).order_by(GpuPrice.gpu_type, GpuPrice.kind)
    if gpu_type is not None:
        query = query.where(GpuPrice.gpu_type == gpu_type)
    return session.scalars(query).all()


def get_key(session: Session, key_id: int) -> ApiKey:
    """The API key with this id."""
    row = session.get(ApiKey, key_id)
    if row is None:
        raise NotFound(f"API key {key_id} not found", param="key_id")
    return row


def list_keys(session: Session, include_revoked: bool = False) -> Sequence[ApiKey]:
    """API keys, newest first."""
    query = select(ApiKey).order_by(ApiKey.id.desc())
    if not include_revoked:
        query = query.where(ApiKey.revoked_at.is_(None))
    return session.scalars(query).all()


def record_audit(
    session: Session,
    *,
    actor: str,
    action: str,
    resource: tuple[str, str],
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
) -> AuditEntry | None:
    """Append one change to the audit log, in the same transaction; a no-op is not a change."""
    if before is not None and before == after:
        return None
    resource_type, resource_id = resource
    entry = AuditEntry(
        actor=actor,
        action=action,
        resource_type=resource_type,
        resource_id=resource_id,
        before=before,
        after=after,
    )
    session.add(entry)
    session.flush()
    return entry


def list_audit(
    session: Session,
    *,
    resource_type: str | None = None,
    resource_id: str | None = None,
    before_id: int | None = None,
    limit: int = 100,
) -> Sequence[AuditEntry]:
    """Audit entries, newest first, optionally of one resource, paged by id."""
    query = select(AuditEntry).order_by(AuditEntry.id.desc()).limit(limit)
    if resource_type is not None:
        query = query.where(AuditEntry.resource_type == resource_type)
    if resource_id is not None:
        query = query.where(AuditEntry.resource_id == resource_id)
    if before_id is not None:
        query = query.where(AuditEntry.id < before_id)
    return session.scalars(query).all()
