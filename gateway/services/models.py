"""Models and their policies: audited changes and the public shape."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError
from sqlalchemy.orm import Session

from gateway.db import queries
from gateway.db.tables import ModelPolicy
from gateway.errors import Conflict, validation_failed
from gateway.schemas import ModelCreate, ModelPublic, Policy


def policy_of(row: ModelPolicy) -> Policy:
    """The policy stored on a model row."""
    return Policy(
        mode=row.mode,
        method=row.method,
        k=row.k,
        itl_objective_ms=row.itl_objective_ms,
        explore_fraction=row.explore_fraction,
        rules=row.rules or [],
    )


def model_public(row: ModelPolicy) -> ModelPublic:
    """A model as the API shows it."""
    return ModelPublic(
        name=row.name, policy=policy_of(row), created_at=row.created_at, updated_at=row.updated_at
    )


def _snapshot(row: ModelPolicy) -> dict[str, Any]:
    return {"name": row.name, "policy": policy_of(row).model_dump(mode="json")}


def _assign(row: ModelPolicy, policy: Policy) -> None:
    for key, value in policy.model_dump().items():
        setattr(row, key, value)


def create_model(session: Session, data: ModelCreate, actor: str) -> ModelPolicy:
    """Add a model with its policy."""
    row = ModelPolicy(name=data.name)
    _assign(row, data.policy)
    queries.add(session, row, f"model {data.name!r}")
    queries.record_audit(
        session,
        actor=actor,
        action="create",
        resource=("model", row.name),
        before=None,
        after=_snapshot(row),
    )
    return row


def ensure_model(session: Session, name: str, actor: str) -> ModelPolicy:
    """The model called `name`, created with the default policy if it is new."""
    row = queries.find_model(session, name)
    return row or create_model(session, ModelCreate(name=name), actor)


def set_policy(session: Session, name: str, policy: Policy, actor: str) -> ModelPolicy:
    """Replace a model's policy, creating the model if it is new."""
    row = queries.find_model(session, name)
    if row is None:
        try:
            model = ModelCreate(name=name, policy=policy)
        except ValidationError as exc:  # the name comes from the path, unchecked so far
            raise validation_failed(exc.errors()) from None
        return create_model(session, model, actor)
    before = _snapshot(row)
    _assign(row, policy)
    session.flush()
    queries.record_audit(
        session,
        actor=actor,
        action="update",
        resource=("model", name),
        before=before,
        after=_snapshot(row),
    )
    return row


def delete_model(session: Session, name: str, actor: str) -> None:
    """Remove a model that no backend serves any more."""
    row = queries.get_model(session, name)
    serving = queries.list_backends(session, model=name)
    if serving:
        names = ", ".join(b.name for b in serving)
        raise Conflict(f"model {name!r} is served by backends {names}; remove them first")
    before = _snapshot(row)
    session.delete(row)
    session.flush()
    queries.record_audit(
        session, actor=actor, action="delete", resource=("model", name), before=before, after=None
    )


def record_method_switch(
    session: Session,
    model: str,
    before: str | None,
    after: str,
    concurrency: float,
    usd_per_mtok: Mapping[str, float],
    actor: str,
) -> None:
    """Audit an automatic move of `model` to another method, with the load and every
    candidate's $/1M output tokens behind it."""
    queries.record_audit(
        session,
        actor=actor,
        action="switch",
        resource=("model", model),
        before={"method": before},
        after={
            "method": after,
            "concurrency": round(concurrency, 2),
            "usd_per_mtok": {m: round(v, 6) for m, v in usd_per_mtok.items()},
        },
    )
