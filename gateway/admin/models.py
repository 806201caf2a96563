"""Admin API for models and their policies (model names may contain `/`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response

from gateway.db import queries
from gateway.deps import ActorDep, ComponentsDep, SessionDep
from gateway.registry import auto_method
from gateway.schemas.resources import ListOf, ModelCreate, ModelPublic, Policy, PolicySaved
from gateway.services.models import (
    create_model,
    delete_model,
    model_public,
    policy_of,
    policy_warnings,
    set_policy,
)

router = APIRouter(prefix="/models", tags=["models"])


@router.get("")
def list_models(session: SessionDep) -> ListOf[ModelPublic]:
    """Every model with its policy."""
    return ListOf[ModelPublic](data=[model_public(r) for r in queries.list_models(session)])


@router.post("", status_code=201)
def post_model(data: ModelCreate, session: SessionDep, actor: ActorDep) -> ModelPublic:
    """Add a model."""
    return model_public(create_model(session, data, actor))


@router.get("/{name:path}/policy")
def get_policy(name: str, session: SessionDep) -> Policy:
    """A model's policy."""
    return policy_of(queries.get_model(session, name))


@router.put("/{name:path}/policy")
def put_policy(
    name: str,
    policy: Policy,
    session: SessionDep,
    components: ComponentsDep,
    actor: ActorDep,
    immediate: Annotated[
        bool, Query(description="Move all traffic to a newly pinned method at once.")
    ] = False,
) -> PolicySaved:
    """Set a model's policy: auto by load, or pinned to a method and K. Pinning another
    method than the one serving starts a gradual move (`DRAFTGATE_MOVE_STEP_SHARE` of the
    traffic every `DRAFTGATE_MOVE_STEP_S`), shown as `move` until it ends. `warnings` names
    a pinned or rule's method or K that no enabled backend of the model runs (saved all the
    same: requests fall back until one does)."""
    registry, settings = components.registry, components.settings
    steps = None if immediate else (settings.move_step_share, settings.move_step_s)
    auto = auto_method(registry.snapshot, registry.choices, name)
    row = set_policy(session, name, policy, actor, auto_method=auto, steps=steps)
    public = model_public(row)
    warnings = policy_warnings(session, name, policy)
    return PolicySaved(**public.model_dump(), warnings=warnings)


@router.get("/{name:path}")
def get_model(name: str, session: SessionDep) -> ModelPublic:
    """One model."""
    return model_public(queries.get_model(session, name))


@router.delete("/{name:path}", status_code=204)
def remove_model(name: str, session: SessionDep, actor: ActorDep) -> Response:
    """Remove a model no backend serves."""
    delete_model(session, name, actor)
    return Response(status_code=204)
