"""The relay's errors are `GatewayError`s with OpenAI's status, type and code for each case."""

from __future__ import annotations

import pytest

from gateway.errors import (
    BodyTooLarge,
    GatewayError,
    InvalidApiKey,
    InvalidRequest,
    ModelNotAllowed,
    ModelNotFound,
    QuotaExceeded,
    RateLimited,
    ServiceUnavailable,
    UnknownPath,
    UnsupportedMediaType,
    UpstreamError,
    UpstreamTimeout,
)


@pytest.mark.parametrize(
    ("error", "status", "error_type", "code"),
    [
        (InvalidRequest("m", param="model"), 400, "invalid_request_error", None),
        (InvalidApiKey("m"), 401, "invalid_request_error", "invalid_api_key"),
        (ModelNotAllowed("m"), 403, "permission_error", "model_not_allowed"),
        (UnknownPath("m"), 404, "invalid_request_error", "unknown_url"),
        (ModelNotFound("m", param="model"), 404, "invalid_request_error", "model_not_found"),
        (BodyTooLarge("m"), 413, "invalid_request_error", None),
        (UnsupportedMediaType("m"), 415, "invalid_request_error", None),
        (RateLimited("m", retry_after_s=45), 429, "rate_limit_error", "rate_limit_exceeded"),
        (QuotaExceeded("m"), 429, "insufficient_quota", "insufficient_quota"),
        (UpstreamError("m"), 502, "upstream_error", "upstream_error"),
        (UpstreamTimeout("m"), 504, "timeout", "timeout"),
        (
            ServiceUnavailable("m", code="no_healthy_backend", retry_after_s=5),
            503,
            "service_unavailable",
            "no_healthy_backend",
        ),
    ],
)
def test_relay_error_envelopes(
    error: GatewayError, status: int, error_type: str, code: str | None
) -> None:
    assert error.status_code == status
    assert error.envelope() == {
        "error": {"message": "m", "type": error_type, "param": error.param, "code": code}
    }


def test_retry_after_is_per_instance() -> None:
    assert RateLimited("m", retry_after_s=45).retry_after_s == 45
    assert RateLimited("m").retry_after_s is None
    assert ServiceUnavailable("m").retry_after_s is None  # the admin API's 503 has none
