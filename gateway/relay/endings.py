"""How a request ends when it cannot end well: the error envelope, or an SSE error event once
its stream has begun (a cut stream, a gateway failure, a shutdown)."""

from __future__ import annotations

import logging

import orjson

from gateway.errors import BodyTooLarge, GatewayError, UpstreamError
from gateway.relay.asgi import Send
from gateway.relay.exchange import Exchange

logger = logging.getLogger(__name__)


def interrupted(message: str) -> UpstreamError:
    """A stream's end before its backend finished it."""
    return UpstreamError(message, code="stream_interrupted")


def sse_error(error: GatewayError, request_id: str) -> bytes:
    """The event that ends a stream cut short with `error`."""
    body = error.envelope()
    body["error"]["request_id"] = request_id
    return b"data: " + orjson.dumps(body) + b"\n\ndata: [DONE]\n\n"


async def end_cut_stream(x: Exchange, stream: bool, send: Send) -> None:
    """End a stream cancelled by the server (shutdown) with an SSE error event, if started."""
    started = stream and x.status != 0 and not x.responded  # the response head went out
    x.status, x.outcome = 503, "shutdown"
    if not started:
        return
    x.responded = True
    event = sse_error(interrupted("gateway shutting down; the stream was cut"), x.request_id)
    try:
        await send({"type": "http.response.body", "body": event, "more_body": False})
    except OSError:  # the connection is already gone
        logger.debug("client left before the shutdown event")


async def end_failed(x: Exchange, send: Send) -> None:
    """Answer a request the gateway itself failed: a 500 envelope, or, once its response
    has begun, an SSE error event (a whole response's head and body go out together)."""
    started = x.status != 0 and not x.responded
    x.status, x.outcome = 500, "gateway_error"
    if x.responded:
        return
    error = GatewayError("The gateway failed to relay this request", code="internal_error")
    if not started:
        await send_error(send, error, x.request_id)
        return
    x.responded = True
    event = sse_error(error, x.request_id)
    try:
        await send({"type": "http.response.body", "body": event, "more_body": False})
    except OSError:
        logger.debug("client left before the error event")


async def send_error(
    send: Send, error: GatewayError, request_id: str, unread: bool = False
) -> None:
    """The error's envelope; the connection closed after it where the request's body was
    left `unread` (or was too large to read), so the server reads no more of it."""
    body = orjson.dumps(error.envelope())
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"x-request-id", request_id.encode()),
    ]
    if error.retry_after_s is not None:
        headers.append((b"retry-after", str(error.retry_after_s).encode()))
    if unread or isinstance(error, BodyTooLarge):  # the rest of the body is never read
        headers.append((b"connection", b"close"))
    try:
        await send({"type": "http.response.start", "status": error.status_code, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})
    except OSError:  # the client is gone; the ledger still records the request
        logger.debug("client left before the error response")
