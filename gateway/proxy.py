"""The relay: a plain ASGI callable for `POST /v1/*`, kept off FastAPI's request machinery.

Per request: read and check the body, authenticate the key and its limits (memory only),
route, then stream the backend's bytes through as they arrive. Failures before the first
byte reaches the client are retried on the next backend; a stream that breaks later ends
with an SSE error event. Every request ends in exactly one ledger record.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import random
import re
import time
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from gateway.accounting import Ledger, UsageEntry
from gateway.apikeys import hash_key
from gateway.errors import error_body
from gateway.limits import Limiter
from gateway.metrics import GatewayMetrics
from gateway.registry import BackendState, BackendView, KeyView, PolicyView, Registry
from gateway.routing import route
from gateway.settings import Settings
from gateway.sse import UsageTap

logger = logging.getLogger(__name__)
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

REQUEST_ID = re.compile(rb"^[A-Za-z0-9._:-]{1,64}$")  # usage_records.request_id is 64 chars
MAX_MODEL_NAME = 200  # the ledger's column; a client may send anything
COMPLETION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})
SSE_ERROR_TYPE = "upstream_error"


class RelayError(Exception):
    """An error answered with the OpenAI envelope."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        error_type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        retry_after_s: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.error_type = status, message, error_type
        self.code, self.param, self.retry_after_s = code, param, retry_after_s


class ClientGone(Exception):
    """The client disconnected."""


@dataclass
class Exchange:
    """What the ledger and metrics need to know about one request."""

    request_id: str  # the client's x-request-id, or one made here; echoed and forwarded
    ledger_id: str = field(default_factory=lambda: uuid.uuid4().hex)  # unique per record
    started: float = field(default_factory=time.perf_counter)
    created_at: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.UTC))
    model: str | None = None
    key: KeyView | None = None
    backend: BackendView | None = None
    method: str | None = None
    status: int = 0
    outcome: str = "ok"
    first_byte: float | None = None
    last_byte: float | None = None
    chunks: int = 0
    concurrency: float | None = None
    usage: dict[str, Any] | None = None
    responded: bool = False  # the whole response was handed to the server


class Relay:
    """`POST /v1/*` relayed to the model's backends."""

    def __init__(
        self,
        settings: Settings,
        registry: Registry,
        ledger: Ledger,
        limiter: Limiter,
        metrics: GatewayMetrics,
        client: httpx.AsyncClient,
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.ledger = ledger
        self.limiter = limiter
        self.metrics = metrics
        self.client = client
        self.rng = random.Random()  # noqa: S311  (load balancing, not secrets)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope["headers"])
        supplied = headers.get(b"x-request-id", b"")
        exchange = Exchange(supplied.decode() if REQUEST_ID.match(supplied) else "")
        exchange.request_id = exchange.request_id or exchange.ledger_id
        rid = exchange.request_id
        try:
            await self._handle(scope["path"], headers, exchange, receive, send)
        except RelayError as error:
            exchange.status = error.status
            exchange.outcome = "rejected" if exchange.backend is None else "upstream_error"
            await _send_error(send, error, rid)
        except ClientGone:
            exchange.status, exchange.outcome = 499, "client_disconnect"
        finally:
            self._account(exchange)

    async def _handle(
        self, path: str, headers: dict[bytes, bytes], x: Exchange, receive: Receive, send: Send
    ) -> None:
        body = await self._read_body(headers, receive)
        payload = _parse(body)
        model = payload.get("model")
        if not isinstance(model, str) or not model:
            raise RelayError(400, "you must provide a model parameter", param="model")
        x.model = model
        x.key = self._authorize(headers, model)
        backends = self.registry.snapshot.backends.get(model)
        if not backends:
            message = f"The model `{model}` does not exist or has no enabled backend"
            raise RelayError(404, message, code="model_not_found", param="model")
        if path in COMPLETION_PATHS:
            _check_completion(path, payload)
        stream = payload.get("stream") is True
        wants_usage = _wants_usage(payload)
        if stream and path in COMPLETION_PATHS:
            body = _with_usage_options(payload)
        if x.key is not None:
            self.limiter.count_request(x.key.id)
        await self._forward(path, body, backends, x, stream, wants_usage, receive, send)

    async def _read_body(self, headers: dict[bytes, bytes], receive: Receive) -> bytes:
        content_type = headers.get(b"content-type", b"application/json")
        if not content_type.split(b";")[0].strip().lower().endswith(b"json"):
            raise RelayError(415, "Content-Type must be application/json")
        limit, chunks, size = self.settings.max_body_bytes, [], 0
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise RelayError(413, f"Request body larger than {limit} bytes")
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise RelayError(413, f"Request body larger than {limit} bytes")
            chunks.append(chunk)
            if not message.get("more_body"):
                return b"".join(chunks)

    def _authorize(self, headers: dict[bytes, bytes], model: str) -> KeyView | None:
        """The caller's key (None when keys are not required), checked against its limits."""
        authorization = headers.get(b"authorization", b"")
        scheme, _, secret = authorization.decode("latin-1").partition(" ")
        snapshot = self.registry.snapshot
        key = snapshot.keys.get(hash_key(secret.strip())) if scheme.lower() == "bearer" else None
        if key is None:
            if not self.settings.require_api_key:
                return None
            self.metrics.rejections.labels("invalid_api_key").inc()
            raise RelayError(
                401, "Incorrect API key provided", error_type="invalid_request_error",
                code="invalid_api_key",
            )  # fmt: skip
        if key.allowed_models is not None and model not in key.allowed_models:
            self.metrics.rejections.labels("model_not_allowed").inc()
            message = f"This key may not use model `{model}`"
            raise RelayError(403, message, error_type="permission_error", code="model_not_allowed")
        refusal = self.limiter.check(key, snapshot.key_spend_usd.get(key.id, 0.0))
        if refusal is not None:
            self.metrics.rejections.labels(refusal.code).inc()
            raise RelayError(
                refusal.status, refusal.message, error_type="rate_limit_error" if refusal.code
                == "rate_limit_exceeded" else "insufficient_quota", code=refusal.code,
                retry_after_s=refusal.retry_after_s,
            )  # fmt: skip
        return key

    async def _forward(
        self,
        path: str,
        body: bytes,
        backends: tuple[BackendView, ...],
        x: Exchange,
        stream: bool,
        wants_usage: bool,
        receive: Receive,
        send: Send,
    ) -> None:
        snapshot, states = self.registry.snapshot, self.registry.states
        assert x.model is not None
        policy = snapshot.policies.get(x.model) or PolicyView()
        now = time.monotonic()
        plan = route(backends, policy, snapshot.auto_method(x.model), states, now, self.rng)
        if not plan.backends:
            raise RelayError(
                503, f"No healthy backend for model `{x.model}`; retry shortly",
                error_type="service_unavailable", code="no_healthy_backend", retry_after_s=5,
            )  # fmt: skip
        if plan.fallback:
            self.metrics.fallbacks.labels(x.model, plan.fallback).inc()
        last_error: RelayError | None = None
        for attempt, backend in enumerate(plan.backends[: self.settings.max_attempts]):
            if attempt:
                self.metrics.retries.labels(x.model).inc()
            try:
                await self._attempt(path, body, backend, plan.fallback, x, stream, wants_usage,
                                    receive, send)  # fmt: skip
                return
            except _RetryableError as error:
                last_error = error.as_relay_error()
        assert last_error is not None
        raise last_error

    async def _attempt(
        self,
        path: str,
        body: bytes,
        backend: BackendView,
        fallback: str | None,
        x: Exchange,
        stream: bool,
        wants_usage: bool,
        receive: Receive,
        send: Send,
    ) -> None:
        state = self.registry.states[backend.name]
        x.backend, x.method = backend, backend.method
        state.in_flight += 1
        x.concurrency = float(state.in_flight)
        request = self.client.build_request(
            "POST", backend.url + path, content=body, headers=_upstream_headers(x.request_id)
        )
        watcher = asyncio.ensure_future(_until_disconnect(receive, asyncio.current_task(), x))
        try:
            response = await self._send_upstream(request, state)
            try:
                headers = _response_headers(response, backend, fallback, x.request_id)
                if stream and response.status_code < 400:
                    await self._relay_stream(response, headers, x, wants_usage, send)
                else:
                    await self._relay_whole(response, headers, x, send)
            finally:
                await response.aclose()
            _record_success(state)
        except asyncio.CancelledError as exc:
            if watcher.done() and not watcher.cancelled():  # the watcher cancelled us
                raise ClientGone from exc
            raise
        finally:
            watcher.cancel()
            state.in_flight -= 1

    async def _send_upstream(self, request: httpx.Request, state: BackendState) -> httpx.Response:
        """Send and wait for the response head; failures here are safe to retry."""
        try:
            response = await self.client.send(request, stream=True)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            # aiohttp's transport reports a refused connection as ConnectTimeout.
            self._record_failure(state)
            raise _RetryableError(502, f"backend unreachable: {type(exc).__name__}") from exc
        except httpx.TimeoutException as exc:
            self._record_failure(state)
            raise _RetryableError(504, f"backend timed out: {type(exc).__name__}") from exc
        except httpx.TransportError as exc:
            self._record_failure(state)
            raise _RetryableError(502, f"backend unreachable: {type(exc).__name__}") from exc
        if response.status_code >= 500:
            detail = (await response.aread())[:200].decode("utf-8", "replace")
            await response.aclose()
            self._record_failure(state)
            raise _RetryableError(502, f"backend error {response.status_code}: {detail}")
        return response

    def _record_failure(self, state: BackendState) -> None:
        state.failures += 1
        if state.failures >= self.settings.breaker_failures:
            state.open_until = time.monotonic() + self.settings.breaker_cooldown_s

    async def _relay_stream(
        self,
        response: httpx.Response,
        headers: list[tuple[bytes, bytes]],
        x: Exchange,
        wants_usage: bool,
        send: Send,
    ) -> None:
        x.status = response.status_code
        await send({"type": "http.response.start", "status": x.status, "headers": headers})
        tap = UsageTap(strip_usage_chunk=not wants_usage)
        try:
            async for chunk in response.aiter_raw():
                now = time.perf_counter()
                if x.first_byte is None:
                    x.first_byte = now
                x.last_byte = now
                out = tap.feed(chunk)
                if out:
                    await send({"type": "http.response.body", "body": out, "more_body": True})
            rest = tap.finish()
            x.responded = True
            await send({"type": "http.response.body", "body": rest, "more_body": False})
        except httpx.HTTPError as exc:  # the backend broke mid-stream
            x.outcome, x.status = "upstream_error", 502
            if x.backend is not None:
                self._record_failure(self.registry.states[x.backend.name])
            event = tap.finish() + _sse_error(
                f"backend stream broke: {type(exc).__name__}", x.request_id
            )
            x.responded = True
            await send({"type": "http.response.body", "body": event, "more_body": False})
        finally:
            tap.finish()  # a stream cut short still knows its usage from its last chunk
            x.usage, x.chunks = tap.usage, tap.chunks

    async def _relay_whole(
        self, response: httpx.Response, headers: list[tuple[bytes, bytes]], x: Exchange, send: Send
    ) -> None:
        content = await response.aread()
        x.status = response.status_code
        x.first_byte = x.last_byte = time.perf_counter()
        if x.status >= 400:
            x.outcome = "upstream_error" if x.status >= 500 else "client_error"
        x.usage = _usage_of(content)
        headers.append((b"content-length", str(len(content)).encode()))
        await send({"type": "http.response.start", "status": x.status, "headers": headers})
        x.responded = True
        await send({"type": "http.response.body", "body": content, "more_body": False})

    def _account(self, x: Exchange) -> None:
        """Exactly one ledger record and the metrics of a finished request."""
        if x.model is None:
            self.metrics.rejections.labels("malformed").inc()
            return
        usage = x.usage or {}
        prompt = int(usage.get("prompt_tokens") or 0)
        completion = int(usage.get("completion_tokens") or 0)
        cost, baseline = self._costs(x, completion)
        latency = time.perf_counter() - x.started
        ttft = None if x.first_byte is None else x.first_byte - x.started
        method = x.method or "none"
        self.ledger.record(
            UsageEntry(
                request_id=x.ledger_id,
                client_request_id=x.request_id,
                created_at=x.created_at,
                api_key_id=x.key.id if x.key else None,
                model=x.model[:MAX_MODEL_NAME],
                method=x.method,
                backend_name=x.backend.name if x.backend else None,
                prompt_tokens=prompt,
                completion_tokens=completion,
                status_code=x.status,
                outcome=x.outcome,
                latency_ms=latency * 1000,
                ttft_ms=None if ttft is None else ttft * 1000,
                concurrency=x.concurrency,
                cost_usd=cost,
                baseline_cost_usd=baseline,
            )
        )
        if x.key is not None:
            self.limiter.count_usage(x.key.id, prompt + completion, cost)
        self._observe(x, method, latency, ttft, prompt, completion, cost, baseline)

    def _costs(self, x: Exchange, completion: int) -> tuple[float | None, float | None]:
        if x.backend is None or x.method is None or x.model is None or not completion:
            return None, None
        snapshot, c = self.registry.snapshot, x.concurrency or 1.0
        per_mtok = snapshot.usd_per_mtok(x.model, x.method, x.backend, c)
        plain = snapshot.usd_per_mtok(x.model, "plain", x.backend, c)
        cost = None if per_mtok is None else completion * per_mtok / 1e6
        baseline = None if plain is None else completion * plain / 1e6
        return cost, baseline

    def _observe(
        self,
        x: Exchange,
        method: str,
        latency: float,
        ttft: float | None,
        prompt: int,
        completion: int,
        cost: float | None,
        baseline: float | None,
    ) -> None:
        m, model = self.metrics, x.model or ""
        if model not in self.registry.snapshot.backends:
            model = "unknown"  # labels only ever carry the registry's model names
        m.requests.labels(model, method, f"{x.status // 100}xx").inc()
        m.latency.labels(model, method).observe(latency)
        if ttft is not None and x.chunks:
            m.ttft.labels(model, method).observe(ttft)
        if x.chunks > 1 and x.first_byte is not None and x.last_byte is not None:
            m.itl.labels(model, method).observe((x.last_byte - x.first_byte) / (x.chunks - 1))
        if prompt:
            m.tokens.labels(model, method, "prompt").inc(prompt)
        if completion:
            m.tokens.labels(model, method, "completion").inc(completion)
        if cost is not None:
            m.cost.labels(model, method).inc(cost)
            if baseline is not None:
                m.savings.labels(model, method).inc(baseline - cost)


class _RetryableError(Exception):
    """A failure before anything reached the client: the next backend may serve."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message

    def as_relay_error(self) -> RelayError:
        kind = "timeout" if self.status == 504 else "upstream_error"
        return RelayError(self.status, self.message, error_type=kind, code=kind)


def _record_success(state: BackendState) -> None:
    state.failures = 0


def _parse(body: bytes) -> dict[str, Any]:
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise RelayError(400, f"We could not parse the JSON body of your request: {exc}") from None
    if not isinstance(payload, dict):
        raise RelayError(400, "The request body must be a JSON object")
    return payload


def _check_completion(path: str, payload: dict[str, Any]) -> None:
    """Refuse what no backend could accept, before it reaches one."""
    for name in ("max_tokens", "max_completion_tokens", "n"):
        value = payload.get(name)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise RelayError(400, f"{name} must be a positive integer, got {value!r}", param=name)
    if "stream" in payload and not isinstance(payload["stream"], bool | None):
        raise RelayError(
            400, f"stream must be a boolean, got {payload['stream']!r}", param="stream"
        )
    if path.endswith("chat/completions"):
        messages = payload.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RelayError(400, "messages must be a non-empty list", param="messages")
    elif payload.get("prompt") is None:
        raise RelayError(400, "you must provide a prompt", param="prompt")


def _wants_usage(payload: dict[str, Any]) -> bool:
    options = payload.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def _with_usage_options(payload: dict[str, Any]) -> bytes:
    """The body with include_usage and continuous usage asked of the backend."""
    options = payload.get("stream_options")
    options = dict(options) if isinstance(options, dict) else {}
    options["include_usage"] = True
    options["continuous_usage_stats"] = True
    return orjson.dumps({**payload, "stream_options": options})


def _upstream_headers(request_id: str) -> dict[str, str]:
    return {"content-type": "application/json", "x-request-id": request_id}


def _response_headers(
    response: httpx.Response, backend: BackendView, fallback: str | None, request_id: str
) -> list[tuple[bytes, bytes]]:
    headers = [
        (b"content-type", response.headers.get("content-type", "application/json").encode()),
        (b"x-draftgate-backend", backend.name.encode()),
        (b"x-draftgate-method", backend.method.encode()),
        (b"x-request-id", request_id.encode()),
    ]
    if fallback:
        headers.append((b"x-draftgate-fallback", fallback.encode()))
    return headers


def _usage_of(content: bytes) -> dict[str, Any] | None:
    try:
        body = orjson.loads(content)
    except orjson.JSONDecodeError:
        return None
    usage = body.get("usage") if isinstance(body, dict) else None
    return usage if isinstance(usage, dict) else None


def _sse_error(message: str, request_id: str) -> bytes:
    body = error_body(message, SSE_ERROR_TYPE, None, "stream_interrupted")
    body["error"]["request_id"] = request_id
    return b"data: " + orjson.dumps(body) + b"\n\ndata: [DONE]\n\n"


async def _send_error(send: Send, error: RelayError, request_id: str) -> None:
    body = orjson.dumps(error_body(error.message, error.error_type, error.param, error.code))
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"x-request-id", request_id.encode()),
    ]
    if error.retry_after_s is not None:
        headers.append((b"retry-after", str(error.retry_after_s).encode()))
    try:
        await send({"type": "http.response.start", "status": error.status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})
    except OSError:  # the client is gone; the ledger still records the request
        logger.debug("client left before the error response")


async def _until_disconnect(
    receive: Receive, task: asyncio.Task[Any] | None, exchange: Exchange
) -> None:
    """Cancel the request's task when its client disconnects (closing the upstream)."""
    while (await receive())["type"] != "http.disconnect":
        pass
    if task is not None and not exchange.responded:
        task.cancel()
