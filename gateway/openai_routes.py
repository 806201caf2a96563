"""OpenAI-compatible routes served by FastAPI (the relay serves `POST /v1/*`)."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Header, Response

from gateway.apikeys import hash_key
from gateway.deps import Components, ComponentsDep
from gateway.errors import AuthenticationFailed, ModelNotFound

router = APIRouter(tags=["openai"])
STARTED = int(time.time())


def _allowed(components: Components, authorization: str | None) -> frozenset[str] | None:
    """The models the caller's key may use (None: every model); 401 when a key is required
    and none valid is given."""
    snapshot = components.registry.snapshot  # one read: a refresh may replace it meanwhile
    scheme, _, secret = (authorization or "").partition(" ")
    key = snapshot.keys.get(hash_key(secret.strip())) if scheme.lower() == "bearer" else None
    if key is None and components.settings.require_api_key:
        raise AuthenticationFailed("Incorrect API key provided")
    return None if key is None else key.allowed_models


def _card(model: str) -> dict[str, Any]:
    return {"id": model, "object": "model", "created": STARTED, "owned_by": "draftgate"}


@router.get("/v1/models")
def list_models(
    components: ComponentsDep, authorization: Annotated[str | None, Header()] = None
) -> dict[str, Any]:
    """Models with at least one enabled backend that the caller's key may use, in OpenAI's
    list shape."""
    allowed = _allowed(components, authorization)
    models = [
        m for m in sorted(components.registry.snapshot.backends) if allowed is None or m in allowed
    ]
    return {"object": "list", "data": [_card(m) for m in models]}


@router.get("/v1/models/{model:path}")
def retrieve_model(
    model: str, components: ComponentsDep, authorization: Annotated[str | None, Header()] = None
) -> dict[str, Any]:
    """One model, as the OpenAI SDK's `models.retrieve()` reads it (404 when it has no
    enabled backend or the key may not use it)."""
    allowed = _allowed(components, authorization)
    if model not in components.registry.snapshot.backends or (
        allowed is not None and model not in allowed
    ):
        raise ModelNotFound(f"The model `{model}` does not exist", param="model")
    return _card(model)


@router.get("/metrics", include_in_schema=False)
def metrics(components: ComponentsDep) -> Response:
    """Prometheus exposition of the gateway's metrics."""
    body = components.metrics.exposition()
    return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")
