"""OpenAI-compatible routes served by FastAPI (the relay serves `POST /v1/*`)."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Header, Response

from gateway.apikeys import hash_key
from gateway.deps import ServicesDep
from gateway.errors import AuthenticationFailed

router = APIRouter(tags=["openai"])
STARTED = int(time.time())


@router.get("/v1/models")
def list_models(
    services: ServicesDep, authorization: Annotated[str | None, Header()] = None
) -> dict[str, Any]:
    """Models with at least one enabled backend, in OpenAI's list shape."""
    snapshot = services.registry.snapshot  # one read: a refresh may replace it meanwhile
    if services.settings.require_api_key:
        scheme, _, secret = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or hash_key(secret.strip()) not in snapshot.keys:
            raise AuthenticationFailed("Incorrect API key provided")
    models = sorted(snapshot.backends)
    cards = [
        {"id": m, "object": "model", "created": STARTED, "owned_by": "draftgate"} for m in models
    ]
    return {"object": "list", "data": cards}


@router.get("/metrics", include_in_schema=False)
def metrics(services: ServicesDep) -> Response:
    """Prometheus exposition of the gateway's metrics."""
    body = services.metrics.exposition()
    return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")
