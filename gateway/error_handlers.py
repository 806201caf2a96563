"""The app's exception handlers: every error answered as the OpenAI envelope.

Kept apart from `gateway.errors` so the relay, which raises those errors, loads no web
framework."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from gateway.errors import (
    GatewayError,
    ServiceUnavailable,
    ValidationFailed,
    error_body,
    validation_failed,
)

logger = logging.getLogger(__name__)


async def _on_gateway_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, GatewayError)
    headers = None if exc.retry_after_s is None else {"retry-after": str(exc.retry_after_s)}
    return JSONResponse(exc.envelope(), status_code=exc.status_code, headers=headers)


async def _on_validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    error = validation_failed(exc.errors())
    return JSONResponse(error.envelope(), status_code=error.status_code)


async def _on_http_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    kinds = {401: "authentication_error", 404: "not_found_error", 405: "invalid_request_error"}
    body = error_body(str(exc.detail), kinds.get(exc.status_code, "invalid_request_error"))
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)


async def on_out_of_range(_: Request, exc: Exception) -> JSONResponse:
    """A number too large for the database's column: the client's error, not ours."""
    logger.info("refused a value out of range: %s", type(exc).__name__)
    error = ValidationFailed("a number is out of the accepted range", code="invalid_value")
    return JSONResponse(error.envelope(), status_code=error.status_code)


async def _on_unexpected(_: Request, exc: Exception) -> JSONResponse:
    logger.exception("unhandled error", exc_info=exc)
    body = error_body("internal error", "server_error", None, "internal_error")
    return JSONResponse(body, status_code=500)


def install_error_handlers(
    app: FastAPI, authenticate_admin: Callable[[Request], object] | None = None
) -> None:
    """Render every error of the app as the OpenAI envelope.

    FastAPI parses a JSON body before it runs a route's dependencies, so a malformed body
    would be a 422 before the admin token is checked: an anonymous caller could map the
    admin routes by their validation errors. With `authenticate_admin`, a request to
    `/admin/` whose body fails is checked first, and a bad token is the 401 it should be."""

    async def on_validation_error(request: Request, exc: Exception) -> JSONResponse:
        if authenticate_admin is not None and request.url.path.startswith("/admin/"):
            try:
                authenticate_admin(request)
            except GatewayError as refused:
                return await _on_gateway_error(request, refused)
        return await _on_validation_error(request, exc)

    app.add_exception_handler(GatewayError, _on_gateway_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(OverflowError, on_out_of_range)  # SQLite's, on a huge integer
    app.add_exception_handler(Exception, _on_unexpected)


async def on_database_unavailable(_: Request, exc: Exception) -> JSONResponse:
    logger.warning("database unavailable: %s", type(exc).__name__)
    error = ServiceUnavailable("database unavailable; retry shortly")
    return JSONResponse(error.envelope(), status_code=error.status_code)


def limited(receive: Any, limit: int) -> Any:
    """`receive` refusing (413, rendered as the envelope) a body beyond `limit` bytes."""
    size = 0

    async def limited() -> Any:
        nonlocal size
        message = await receive()
        size += len(message.get("body", b""))
        if size > limit:
            message = f"Request body larger than {limit} bytes"
            raise StarletteHTTPException(413, message, headers={"connection": "close"})
        return message

    return limited
