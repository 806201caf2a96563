"""OpenAI-compatible routes served by FastAPI (the relay serves `POST /v1/*`)."""

from __future__ import annotations

import hmac
import time
from typing import Annotated, Any

import httpx
from fastapi import APIRouter, Header, Response
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from gateway.apikeys import hash_key
from gateway.deps import Components, ComponentsDep
from gateway.errors import AuthenticationFailed, ModelNotFound, ResponseNotFound, UpstreamError
from gateway.homes import checked_id, not_found
from gateway.registry import KeyView

router = APIRouter(tags=["openai"])
STARTED = int(time.time())


def _key(components: Components, authorization: str | None) -> KeyView | None:
    """The caller's key (None: keyless); 401 when a key is required and none valid given."""
    snapshot = components.registry.snapshot  # one read: a refresh may replace it meanwhile
    scheme, _, secret = (authorization or "").partition(" ")
    key = snapshot.keys.get(hash_key(secret.strip())) if scheme.lower() == "bearer" else None
    if key is None and components.settings.require_api_key:
        raise AuthenticationFailed("Incorrect API key provided")
    return key


def _allowed(components: Components, authorization: str | None) -> frozenset[str] | None:
    """The models the caller's key may use (None: every model); 401 when a key is required
    and none valid is given."""
    key = _key(components, authorization)
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


@router.get("/v1/responses/{response_id}")
async def retrieve_response(
    response_id: str,
    components: ComponentsDep,
    authorization: Annotated[str | None, Header()] = None,
    stream: bool | None = None,
    starting_after: int | None = None,
) -> Response:
    """A stored response (the Responses API), from the backend that made and holds it: 404
    when no backend holds it for the caller's key. `stream` and `starting_after` resume a
    background response's events, as vLLM serves them."""
    query = {"stream": stream, "starting_after": starting_after}
    params = {k: str(v).lower() for k, v in query.items() if v is not None}
    return await _at_home(components, authorization, response_id, "GET", "", params)


@router.post("/v1/responses/{response_id}/cancel")
async def cancel_response(
    response_id: str,
    components: ComponentsDep,
    authorization: Annotated[str | None, Header()] = None,
) -> Response:
    """Cancel a background response on the backend that holds it (vLLM answers 400 for one
    already finished)."""
    return await _at_home(components, authorization, response_id, "POST", "/cancel", {})


async def _at_home(
    components: Components,
    authorization: str | None,
    response_id: str,
    method: str,
    suffix: str,
    params: dict[str, str],
) -> Response:
    """Send a stored response's request to its backend; relay the answer as it comes."""
    key = _key(components, authorization)
    checked = checked_id(response_id, "response_id")
    assert components.homes is not None
    assert components.control is not None
    home = await components.homes.find(checked)
    if home is None or not home.owned_by(key):
        raise not_found(checked, "response_id")
    backends = components.registry.snapshot.backends.values()
    backend = next((b for group in backends for b in group if b.name == home.backend), None)
    if backend is None:
        raise ResponseNotFound(
            f"Response with id '{checked}' was stored on backend `{home.backend}`, which no "
            "longer serves: it is gone with that server.",
            param="response_id",
        )
    request = components.control.build_request(
        method,
        f"{backend.url}/v1/responses/{checked}{suffix}",
        params=params,
        headers={"accept-encoding": "identity", **backend.auth()},
    )
    try:
        answer = await components.control.send(request, stream=True)
    except httpx.HTTPError as exc:
        raise UpstreamError(f"backend `{backend.name}` unreachable: {exc}") from exc
    return StreamingResponse(
        answer.aiter_raw(),
        status_code=answer.status_code,
        media_type=answer.headers.get("content-type", "application/json"),
        headers={"x-draftgate-backend": backend.name},
        background=BackgroundTask(answer.aclose),
    )


@router.get("/metrics", include_in_schema=False)
def metrics(
    components: ComponentsDep, authorization: Annotated[str | None, Header()] = None
) -> Response:
    """Prometheus exposition of the gateway's metrics (behind DRAFTGATE_METRICS_TOKEN when
    one is set)."""
    token = components.settings.metrics_token
    if token is not None:
        scheme, _, given = (authorization or "").partition(" ")
        wanted = token.get_secret_value().encode()
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), wanted):
            raise AuthenticationFailed("/metrics needs DRAFTGATE_METRICS_TOKEN as bearer token")
    body = components.metrics.exposition()
    return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")
