"""OpenAI-compatible routes served by FastAPI (the relay serves `POST /v1/*`)."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Response

from gateway.deps import ServicesDep

router = APIRouter(tags=["openai"])
STARTED = int(time.time())


@router.get("/v1/models")
def list_models(services: ServicesDep) -> dict[str, Any]:
    """Models with at least one enabled backend, in OpenAI's list shape."""
    models = sorted(services.registry.snapshot.backends)
    cards = [
        {"id": m, "object": "model", "created": STARTED, "owned_by": "draftgate"} for m in models
    ]
    return {"object": "list", "data": cards}


@router.get("/metrics", include_in_schema=False)
def metrics(services: ServicesDep) -> Response:
    """Prometheus exposition of the gateway's metrics."""
    body = services.metrics.exposition()
    return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")
