"""The one error model: `GatewayError` and its rendering as the OpenAI error envelope.

No web framework here: the relay raises these too. The app's handlers that answer them
over FastAPI are in `gateway.error_handlers`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel


class GatewayError(Exception):
    """An error with an HTTP status, rendered as `{"error": {...}}`."""

    status_code = 500
    error_type = "server_error"
    code: str | None = None
    retry_after_s: int | None = None  # sent as `Retry-After` when set

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after_s: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        if retry_after_s is not None:
            self.retry_after_s = retry_after_s

    def envelope(self) -> dict[str, Any]:
        """The OpenAI error body."""
        return error_body(self.message, self.error_type, self.param, self.code)


class InvalidRequest(GatewayError):
    """The request is malformed or names invalid values."""

    status_code = 400
    error_type = "invalid_request_error"


class ValidationFailed(InvalidRequest):
    """A well-formed body whose fields fail validation."""

    status_code = 422


class UnknownPath(InvalidRequest):
    """No such `/v1` endpoint (OpenAI answers this as an invalid request)."""

    status_code = 404
    code = "unknown_url"


class ModelNotFound(InvalidRequest):
    """The model has no enabled backend."""

    status_code = 404
    code = "model_not_found"


class ResponseNotFound(InvalidRequest):
    """A stored response (the Responses API) that is not there, or not the key's."""

    status_code = 404
    code = "response_not_found"


class BodyTooLarge(InvalidRequest):
    """The request body is larger than `max_body_bytes`."""

    status_code = 413


class UnsupportedMediaType(InvalidRequest):
    """The request body is not JSON."""

    status_code = 415


class InvalidApiKey(InvalidRequest):
    """A `/v1` request without a known API key (OpenAI's type for it)."""

    status_code = 401
    code = "invalid_api_key"


class InvalidToken(InvalidApiKey):
    """A `/v1` bearer token (a JWT) that fails a check: signature, issuer, audience, times."""

    code = "invalid_token"


class TokenExpired(InvalidToken):
    """A `/v1` bearer token (a JWT) past its `exp` (and the leeway)."""

    code = "token_expired"


class TeamNotFound(GatewayError):
    """A valid token whose team claim names no team of the gateway's."""

    status_code = 403
    error_type = "permission_error"
    code = "team_not_found"


class AuthenticationFailed(GatewayError):
    """Missing or wrong credentials."""

    status_code = 401
    error_type = "authentication_error"
    code = "invalid_api_key"


class InsufficientScope(GatewayError):
    """A read token asked for a change."""

    status_code = 403
    error_type = "permission_error"
    code = "insufficient_scope"


class UntrustedProxy(GatewayError):
    """An admin request naming a person in the login proxy's header, from an address that
    is not a trusted proxy's."""

    status_code = 403
    error_type = "permission_error"
    code = "untrusted_proxy"


class HostNotAllowed(GatewayError):
    """A keyless gateway was asked under a host name it does not serve."""

    status_code = 403
    error_type = "permission_error"
    code = "host_not_allowed"


class ModelNotAllowed(GatewayError):
    """The API key may not use the model."""

    status_code = 403
    error_type = "permission_error"
    code = "model_not_allowed"


class RateLimited(GatewayError):
    """The API key is over its requests or tokens per minute."""

    status_code = 429
    error_type = "rate_limit_error"
    code = "rate_limit_exceeded"


class QuotaExceeded(GatewayError):
    """The API key's budget is spent."""

    status_code = 429
    error_type = "insufficient_quota"
    code = "insufficient_quota"


class NotFound(GatewayError):
    """The named resource does not exist."""

    status_code = 404
    error_type = "not_found_error"
    code = "not_found"


class Conflict(GatewayError):
    """The resource already exists."""

    status_code = 409
    error_type = "conflict_error"
    code = "already_exists"


class ServiceUnavailable(GatewayError):
    """A dependency (database, every backend) is unavailable."""

    status_code = 503
    error_type = "service_unavailable"
    code = "service_unavailable"


class UpstreamError(GatewayError):
    """A backend failed: unreachable, a 5xx, a redirect, or a stream that broke."""

    status_code = 502
    error_type = "upstream_error"
    code = "upstream_error"


class PoisonRequest(UpstreamError):
    """A request two backends failed alike: its own fault, not theirs; not retried."""

    code = "request_failed_on_backends"


class UpstreamTimeout(GatewayError):
    """A backend did not answer in time."""

    status_code = 504
    error_type = "timeout"
    code = "timeout"


class ErrorDetail(BaseModel):
    """The inside of the OpenAI error envelope."""

    message: str
    type: str
    param: str | None
    code: str | None


class ErrorEnvelope(BaseModel):
    """`{"error": {...}}`: every error the gateway answers with."""

    error: ErrorDetail


def _documented(description: str) -> dict[str, Any]:
    return {"model": ErrorEnvelope, "description": description}


# The errors any admin route may answer with, documented in the OpenAPI (422 replaces
# FastAPI's own validation schema: ours is the envelope too).
ADMIN_ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: _documented("Invalid request"),
    401: _documented("Missing or wrong admin token"),
    403: _documented("A read token asked for a change (`insufficient_scope`)"),
    404: _documented("No such resource"),
    409: _documented("The resource already exists or is in use"),
    413: _documented("The request body is larger than `max_body_bytes`"),
    422: _documented("A field fails validation (its name in `param`)"),
    503: _documented("The database is unavailable; retry shortly"),
}


def error_body(
    message: str, error_type: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """Build the OpenAI error envelope."""
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def _location(error: Mapping[str, Any]) -> str:
    """The dotted field an error is about; a model-level error may name its field itself."""
    parts = [str(p) for p in error.get("loc", ()) if p not in ("body", "query", "path")]
    field = getattr(error.get("ctx", {}).get("error"), "field", None)
    if isinstance(field, str):
        parts.append(field)
    return ".".join(parts) or "body"


def _describe(error: Mapping[str, Any]) -> str:
    if error.get("type") == "json_invalid":
        return "request body is not valid JSON"
    return f"{_location(error)}: {error.get('msg', 'invalid value')}"


def validation_failed(errors: Sequence[Mapping[str, Any]]) -> ValidationFailed:
    """A 422 that names the offending fields, the first one as `param`."""
    if not errors:
        return ValidationFailed("invalid request", code="invalid_value")
    first = errors[0]
    param = None if first.get("type") == "json_invalid" else _location(first)
    message = "; ".join(_describe(e) for e in errors[:5])
    return ValidationFailed(message, param=param, code="invalid_value")
