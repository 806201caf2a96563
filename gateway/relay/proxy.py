"""The relay: a plain ASGI callable for `POST /v1/*`, kept off FastAPI's request machinery.

Per request: read and check the body, authenticate the key and its limits (memory only),
route, then stream the backend's bytes through as they arrive. Failures before the first
byte reaches the client are retried on the next backend, except a whole (non-streamed)
response that outlasts the read timeout: its backend accepted it and worked on it, so it is
answered 504 and charged an estimate of that work. A stream that breaks later ends with an
SSE error event. Every request ends in exactly one ledger record.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

import orjson

from gateway.accounting import Ledger
from gateway.apikeys import hash_key
from gateway.errors import (
    BodyTooLarge,
    GatewayError,
    HostNotAllowed,
    InvalidApiKey,
    InvalidRequest,
    ModelNotAllowed,
    ModelNotFound,
    PoisonRequest,
    ServiceUnavailable,
    UnknownPath,
    UnsupportedMediaType,
    UpstreamError,
    UpstreamTimeout,
)
from gateway.limits import Limiter
from gateway.metrics import GatewayMetrics
from gateway.policy.affinity import Affinity, session_key
from gateway.policy.moves import position_of
from gateway.policy.rules import CLASS_HEADER, first_match
from gateway.policy.rules import Request as RuleRequest
from gateway.registry import BackendState, BackendView, KeyView, PolicyView, Registry, Snapshot
from gateway.relay.checks import (
    COMPLETION_PATHS,
    INCLUDE_COST_HEADER,
    UsageAsked,
    check_completion,
    parse_body,
    usage_asked,
    with_usage_options,
)
from gateway.relay.exchange import Exchange, admit, estimate_abandoned, price, settle
from gateway.relay.routing import route
from gateway.relay.spans import request_attributes
from gateway.relay.sse import DONE, UsageTap
from gateway.relay.upstream import (
    Upstream,
    UpstreamBroke,
    UpstreamResponse,
    UpstreamTimedOut,
    UpstreamUnreachable,
)
from gateway.server.http_limits import LOST, ON_DISCONNECT, STALLED
from gateway.settings import Settings
from gateway.usage import tokens_of

if TYPE_CHECKING:
    from gateway.events.tracing import Tracing

logger = logging.getLogger(__name__)
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

REQUEST_ID = re.compile(rb"^[A-Za-z0-9._:-]{1,64}$")  # usage_records.request_id is 64 chars
# Before the JSON of a stream's cost (its usage record's cost_usd, cost_error_usd and
# curve_source), when the client sent `x-draftgate-include-cost: true`.
COST_COMMENT = b": x-draftgate-cost "


class ClientGone(Exception):
    """The client disconnected."""


class Relay:
    """`POST /v1/*` relayed to the model's backends."""

    def __init__(
        self,
        settings: Settings,
        registry: Registry,
        ledger: Ledger,
        limiter: Limiter,
        metrics: GatewayMetrics,
        client: Upstream,
        tracing: Tracing | None = None,
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.ledger = ledger
        self.limiter = limiter
        self.metrics = metrics
        self.client = client
        self.tracing = tracing  # None when tracing is off: then no tracing work at all
        self.rng = random.Random()  # noqa: S311  (load balancing, not secrets)
        self.forwarded = settings.forwarded_headers
        self.relayed = settings.relayed
        # Without keys any web page could spend the fleet through a browser on this machine
        # (a form post, or DNS rebinding): then only listed hosts and JSON bodies are served.
        self.keyless_hosts = None if settings.require_api_key else settings.keyless_hosts
        self.affinity_header = settings.affinity_header_name
        self.classes = settings.classes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope["headers"])
        supplied = headers.get(b"x-request-id", b"")
        exchange = Exchange(supplied.decode() if REQUEST_ID.match(supplied) else "")
        exchange.request_id = exchange.request_id or exchange.ledger_id
        rid = exchange.request_id
        if self.tracing is not None:
            exchange.span = self.tracing.start_request(scope["path"], headers)
        try:
            departure = Departure(scope, receive, exchange)
            await self._handle(scope["path"], headers, exchange, receive, departure, send)
        except GatewayError as error:
            exchange.status = error.status_code
            exchange.outcome = "rejected" if exchange.backend is None else "upstream_error"
            await _send_error(send, error, rid)
        except ClientGone:
            stalled = scope.get(STALLED, False)  # cut by the server: it stopped reading
            exchange.status = 499
            exchange.outcome = "client_stalled" if stalled else "client_disconnect"
        except Exception:  # the top of the relay: a bug is a 500 envelope and a record
            logger.exception("request %s failed in the gateway", rid)
            await _end_failed(exchange, send)
        finally:
            try:
                settle(exchange, self.ledger, self.limiter, self.metrics)
            except Exception:  # the top of the relay: accounting must not drop the connection
                logger.exception("settling request %s failed", exchange.request_id)
            if self.tracing is not None:
                self._end_span(exchange, self.tracing)

    def _end_span(self, exchange: Exchange, tracing: Tracing) -> None:
        try:
            attributes = request_attributes(exchange)
            tracing.end_request(exchange.span, attributes, exchange.status, exchange.outcome)
        except Exception:  # the top of the relay: a span must not drop the connection
            logger.exception("ending the span of request %s failed", exchange.request_id)

    async def _handle(
        self,
        path: str,
        headers: dict[bytes, bytes],
        x: Exchange,
        receive: Receive,
        departure: Departure,
        send: Send,
    ) -> None:
        if path not in self.relayed:  # an exact list: no dot segments, no operator routes
            raise UnknownPath(f"Unknown path {path[:100]!r}")
        if self.keyless_hosts is not None:
            keyless_door(headers, self.keyless_hosts)
        body = await self._read_body(headers, receive)
        payload = parse_body(body, self.settings.max_json_depth)
        model = payload.get("model")
        if not isinstance(model, str) or not model:
            raise InvalidRequest("you must provide a model parameter", param="model")
        x.model, x.snapshot = model, self.registry.snapshot  # the request's only read of it
        x.forward = {
            n.decode(): v.decode("latin-1") for n in self.forwarded if (v := headers.get(n))
        }
        x.key = self._authorize(headers, model, x.snapshot)
        backends = x.snapshot.backends.get(model)
        if not backends:
            message = f"The model `{model}` does not exist or has no enabled backend"
            raise ModelNotFound(message, param="model")
        if path in COMPLETION_PATHS:
            check_completion(path, payload)
        x.request_class = self._request_class(headers.get(CLASS_HEADER), x.key)
        policy = x.snapshot.policies.get(model)
        if policy is not None and policy.rules:  # no rules, no cost
            x.rule = first_match(policy.rules, RuleRequest(payload, x.request_class))
        if self.settings.affinity:
            header = headers.get(self.affinity_header, b"")
            found = session_key(header, payload, self.settings.affinity_prefix_chars)
            if found is not None:
                x.affinity = Affinity(found[0], self.settings.affinity_balance)
        stream = payload.get("stream") is True
        asked = usage_asked(path, payload, headers.get(INCLUDE_COST_HEADER, b""))
        if stream and path in COMPLETION_PATHS:
            body = with_usage_options(payload)
        states, limit = self.registry.states, self.settings.default_max_model_len
        admit(x, path, payload, len(body), states, limit, self.limiter, self.metrics)
        try:
            await self._forward(path, body, backends, x, stream, asked, departure, send)
        except (ClientGone, UpstreamTimeout):
            if not stream:  # the backend never said what it generated: estimate it
                estimate_abandoned(x, path, payload, len(body), limit)
            raise

    async def _read_body(self, headers: dict[bytes, bytes], receive: Receive) -> bytes:
        content_type = headers.get(b"content-type", b"application/json")  # as vLLM reads it
        if not content_type.split(b";")[0].strip().lower().endswith(b"json"):
            raise UnsupportedMediaType("Content-Type must be application/json")
        limit, chunks, size = self.settings.max_body_bytes, [], 0
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise BodyTooLarge(f"Request body larger than {limit} bytes")
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise BodyTooLarge(f"Request body larger than {limit} bytes")
            chunks.append(chunk)
            if not message.get("more_body"):
                return b"".join(chunks)

    def _request_class(self, header: bytes | None, key: KeyView | None) -> str:
        """The header's class, else the key's, else the default; an unknown one is a 400."""
        if header is None:
            return key.request_class if key is not None and key.request_class else self.classes[0]
        name = header.decode("latin-1").strip().lower()
        if name not in self.classes:
            known = ", ".join(self.classes)
            raise InvalidRequest(
                f"Unknown request class {name[:40]!r} in x-draftgate-class; known: {known}",
                param="x-draftgate-class",
                code="unknown_request_class",
            )
        return name

    def _authorize(
        self, headers: dict[bytes, bytes], model: str, snapshot: Snapshot
    ) -> KeyView | None:
        """The caller's key (None when keys are not required) and the models it may use."""
        authorization = headers.get(b"authorization", b"")
        scheme, _, secret = authorization.decode("latin-1").partition(" ")
        key = snapshot.keys.get(hash_key(secret.strip())) if scheme.lower() == "bearer" else None
        if key is None:
            if not self.settings.require_api_key:
                return None
            self.metrics.rejections.labels("invalid_api_key").inc()
            raise InvalidApiKey("Incorrect API key provided")
        if key.allowed_models is not None and model not in key.allowed_models:
            self.metrics.rejections.labels("model_not_allowed").inc()
            raise ModelNotAllowed(f"This key may not use model `{model}`")
        return key

    async def _forward(
        self,
        path: str,
        body: bytes,
        backends: tuple[BackendView, ...],
        x: Exchange,
        stream: bool,
        asked: UsageAsked,
        departure: Departure,
        send: Send,
    ) -> None:
        snapshot, states = x.snapshot, self.registry.states  # states are live by design
        assert x.model is not None
        assert snapshot is not None
        policy = snapshot.policies.get(x.model) or PolicyView()
        own = x.request_class if x.request_class in policy.classes else None
        auto_method = self.registry.auto_method(x.model, snapshot, own)
        held_back, wall = None, time.time()
        move = self.registry.move_of(x.model, policy, wall) if x.rule is None else None
        if move is not None:  # a gradual move: this request's place says which side serves it
            key = x.affinity.key if x.affinity is not None else None
            if not move.goes_to_target(wall, position_of(key, self.rng.random())):
                held_back = (move.target, move.source)
        now = time.monotonic()
        plan = route(
            backends, policy, auto_method, states, now, self.rng, x.rule, x.affinity, held_back
        )
        if plan.affinity is not None:
            x.affinity_outcome = plan.affinity
            self.metrics.affinity_routes.labels(x.model, plan.affinity).inc()
        if x.rule is not None:
            self.metrics.rule_matches.labels(x.model, str(x.rule.index)).inc()
        if plan.fallback:
            x.fallback = plan.fallback
            self.metrics.fallbacks.labels(x.model, plan.fallback).inc()
        if plan.panic:
            self.metrics.panic_routes.labels(x.model).inc()
        last_error: GatewayError | None = None
        suspects: list[BackendState] = []  # backends that answered this request with a 5xx
        for attempt, backend in enumerate(plan.backends[: self.settings.max_attempts]):
            if attempt:
                self.metrics.retries.labels(x.model).inc()
            try:
                await self._attempt(
                    path, body, backend, plan.fallback, x, stream, asked, departure, send
                )
            except _Retryable as retryable:
                last_error = retryable.error
                if retryable.answered is None:
                    continue
                if suspects:  # a second backend failed it alike: the request is the cause
                    self.metrics.poison_requests.labels(x.model).inc()
                    raise PoisonRequest(
                        f"The request failed on {len(suspects) + 1} backends alike "
                        f"({last_error.message}); it is not retried"
                    ) from None
                suspects.append(retryable.answered)
                continue
            except UpstreamTimeout:  # accepted, then too slow: no other backend tries it
                for state in suspects:
                    self._record_failure(state)
                raise
            for state in suspects:  # another backend served what they failed
                self._record_failure(state)
            return
        for state in suspects:  # no other backend tried it: the failure stays theirs
            self._record_failure(state)
        if plan.panic or last_error is None:
            detail = f" (last: {last_error.message})" if last_error else ""
            message = f"No healthy backend for model `{x.model}`; retry shortly{detail}"
            raise ServiceUnavailable(message, code="no_healthy_backend", retry_after_s=5)
        raise last_error

    async def _attempt(
        self,
        path: str,
        body: bytes,
        backend: BackendView,
        fallback: str | None,
        x: Exchange,
        stream: bool,
        asked: UsageAsked,
        departure: Departure,
        send: Send,
    ) -> None:
        state = self.registry.states[backend.name]
        x.backend, x.method = backend, backend.method
        x.attempts += 1
        state.begin(time.monotonic())
        x.concurrency = state.load()  # the backend's load, alike on every replica
        upstream = _upstream_headers(x, backend)
        if self.tracing is not None and x.span is not None:  # the backend continues our span
            self.tracing.inject(x.span, upstream)
        departure.arm()
        x.sent = time.perf_counter()
        try:
            response = await self._send_upstream(backend.url + path, body, upstream, state, stream)
            try:
                headers = _response_headers(response, backend, fallback, x)
                headers += self._limit_headers(x)
                if stream and response.status_code < 400:
                    await self._relay_stream(response, headers, x, asked, send)
                else:
                    await self._relay_whole(response, headers, x, send)
            finally:
                await response.aclose()
            if x.outcome != "upstream_error":  # a stream that broke counted as a failure
                _record_success(state)
        except (_Retryable, UpstreamTimeout) as failed:
            if self.tracing is not None and x.span is not None:
                error = failed.error if isinstance(failed, _Retryable) else failed
                self.tracing.attempt_failed(x.span, backend, error)
            raise
        except asyncio.CancelledError as exc:
            if departure.happened:  # the client left: that cancelled us
                raise ClientGone from exc
            await _end_cut_stream(x, stream, send)  # the server's shutdown grace ran out
            raise
        finally:
            departure.disarm()
            state.end(time.monotonic())

    async def _send_upstream(
        self, url: str, body: bytes, headers: dict[str, str], state: BackendState, stream: bool
    ) -> UpstreamResponse:
        """Send and wait for the response head; failures here are safe to retry, but one: a
        whole response's head that does not come within the read timeout. vLLM heads a
        stream at once but a whole response only when generation ends, so that backend took
        the request and is working on it: trying it elsewhere would generate it again. It is
        not counted against the breaker either: one long request is no failing backend."""
        try:
            response = await self.client.send(url, body, headers)
        except UpstreamTimedOut as exc:
            if not stream:
                raise UpstreamTimeout(f"backend timed out: {exc}") from exc
            self._record_failure(state)
            raise _Retryable(UpstreamTimeout(f"backend timed out: {exc}")) from exc
        except UpstreamUnreachable as exc:
            self._record_failure(state)
            raise _Retryable(UpstreamError(f"backend unreachable: {exc}")) from exc
        if response.status_code >= 500:
            # Counted against the breaker by the caller once it knows whose failure it is.
            detail = (await response.aread())[:200].decode("utf-8", "replace")
            await response.aclose()
            error = UpstreamError(f"backend error {response.status_code}: {detail}")
            raise _Retryable(error, answered=state)
        if response.status_code == 401:  # the gateway's key for it, not the client's, is wrong
            await response.aclose()
            self._record_failure(state)
            message = "backend refused the gateway's credentials (401); check its api_key"
            raise _Retryable(UpstreamError(message))
        if 300 <= response.status_code < 400:  # never followed, nor passed on: a misconfiguration
            await response.aclose()
            self._record_failure(state)
            message = f"backend answered {response.status_code}; redirects are not followed"
            raise _Retryable(UpstreamError(message))
        return response

    def _limit_headers(self, x: Exchange) -> list[tuple[bytes, bytes]]:
        """The key's limits and what is left of them this minute, as OpenAI names them
        (reservations in flight count as used)."""
        if x.key is None:
            return []
        rpm, tpm = x.key.requests_per_minute, x.key.tokens_per_minute
        requests, tokens = self.limiter.remaining(x.key)
        headers = []
        if rpm is not None and requests is not None:
            headers.append((b"x-ratelimit-limit-requests", b"%d" % rpm))
            headers.append((b"x-ratelimit-remaining-requests", b"%d" % requests))
        if tpm is not None and tokens is not None:
            headers.append((b"x-ratelimit-limit-tokens", b"%d" % tpm))
            headers.append((b"x-ratelimit-remaining-tokens", b"%d" % tokens))
        return headers

    def _record_failure(self, state: BackendState) -> None:
        state.failures += 1
        if state.failures >= self.settings.breaker_failures:
            state.open_until = time.monotonic() + self.settings.breaker_cooldown_s

    async def _relay_stream(
        self,
        response: UpstreamResponse,
        headers: list[tuple[bytes, bytes]],
        x: Exchange,
        asked: UsageAsked,
        send: Send,
    ) -> None:
        x.status = response.status_code
        await send({"type": "http.response.start", "status": x.status, "headers": headers})
        tap = UsageTap(strip_usage_chunk=not asked.final, strip_chunk_usage=not asked.every_chunk)
        held = b""  # from `data: [DONE]` on, when the cost comment is to go before it
        # Asked for identity; a compressing hop that ignores it is decoded, so the tap (and the
        # client, who gets no content-encoding header) reads text.
        try:
            while chunk := await response.next_chunk():
                now = time.perf_counter()
                if x.first_byte is None:
                    x.first_byte = now
                x.last_byte = now
                out = tap.feed(chunk)
                if asked.cost:
                    out, held = _hold_done(out, held)
                if out:
                    await send({"type": "http.response.body", "body": out, "more_body": True})
            rest = tap.finish()
            if asked.cost:
                rest, held = _hold_done(rest, held)
                rest += self._cost_comment(x, tap) + held
            x.responded = True
            await send({"type": "http.response.body", "body": rest, "more_body": False})
        except (UpstreamBroke, UpstreamTimedOut) as exc:  # the backend broke mid-stream
            x.outcome, x.status = "upstream_error", 502
            if x.backend is not None:
                self._record_failure(self.registry.states[x.backend.name])
            broke = _interrupted(f"backend stream broke: {exc}")
            event = tap.finish()
            if asked.cost:
                event += self._cost_comment(x, tap)
            event += _sse_error(broke, x.request_id)
            x.responded = True
            await send({"type": "http.response.body", "body": event, "more_body": False})
        finally:
            tap.finish()  # a stream cut short still knows its usage from its last chunk
            x.usage, x.chunks = tap.usage, tap.chunks

    def _cost_comment(self, x: Exchange, tap: UsageTap) -> bytes:
        """The SSE comment that tells a stream's client its cost, as its usage record holds
        it (clients skip comments: the stream stays valid for every SSE parser)."""
        x.usage = tap.usage
        costs = price(x, tokens_of(x.usage), time.perf_counter() - x.started, self.metrics)
        said = {"cost_usd": costs.cost, "cost_error_usd": costs.cost_error,
                "curve_source": costs.source}  # fmt: skip
        return COST_COMMENT + orjson.dumps(said) + b"\n\n"

    async def _relay_whole(
        self,
        response: UpstreamResponse,
        headers: list[tuple[bytes, bytes]],
        x: Exchange,
        send: Send,
    ) -> None:
        try:
            content = await response.aread()
        except (UpstreamBroke, UpstreamTimedOut) as exc:  # head, then no whole body
            if x.backend is not None:
                self._record_failure(self.registry.states[x.backend.name])
            if isinstance(exc, UpstreamTimedOut):
                raise UpstreamTimeout(f"backend timed out: {exc}") from exc
            raise UpstreamError(f"backend broke: {exc}") from exc
        x.status = response.status_code
        x.first_byte = x.last_byte = time.perf_counter()
        if x.status >= 400:
            x.outcome = "upstream_error" if x.status >= 500 else "client_error"
        x.usage = _usage_of(content)
        headers.append((b"content-length", str(len(content)).encode()))
        headers += _cost_headers(x, self.metrics)
        await send({"type": "http.response.start", "status": x.status, "headers": headers})
        x.responded = True
        await send({"type": "http.response.body", "body": content, "more_body": False})


class _Retryable(Exception):
    """A failure before anything reached the client: the next backend may serve."""

    def __init__(
        self, error: UpstreamError | UpstreamTimeout, answered: BackendState | None = None
    ) -> None:
        super().__init__(error.message)
        self.error = error  # the answer, should no backend serve
        self.answered = answered  # the backend that answered with a 5xx (alive, but failed)


def _record_success(state: BackendState) -> None:
    state.failures = 0


def _upstream_headers(x: Exchange, backend: BackendView) -> dict[str, str]:
    """The client's allowed headers, then ours: JSON, the request id, identity encoding (the
    usage tap reads the bytes as they come; a compressed stream would lose its usage) and the
    backend's own key."""
    headers = x.forward | {
        "content-type": "application/json",
        "x-request-id": x.request_id,
        "accept-encoding": "identity",
    }
    if backend.api_key:
        headers["authorization"] = f"Bearer {backend.api_key}"
    return headers


def _response_headers(
    response: UpstreamResponse, backend: BackendView, fallback: str | None, x: Exchange
) -> list[tuple[bytes, bytes]]:
    headers = [
        (b"content-type", response.headers.get("content-type", "application/json").encode()),
        (b"x-draftgate-backend", backend.name.encode()),
        (b"x-draftgate-method", backend.method.encode()),
        (b"x-request-id", x.request_id.encode()),
    ]
    if fallback:
        headers.append((b"x-draftgate-fallback", fallback.encode()))
    if x.rule is not None:  # its position in the policy's rules, from 0
        headers.append((b"x-draftgate-rule", b"%d" % x.rule.index))
    if x.affinity_outcome is not None:
        headers.append((b"x-draftgate-affinity", x.affinity_outcome.encode()))
    return headers


def _cost_headers(x: Exchange, metrics: GatewayMetrics) -> list[tuple[bytes, bytes]]:
    """A whole response's capacity cost, its 95% half-width and the source of its price."""
    costs = price(x, tokens_of(x.usage), time.perf_counter() - x.started, metrics)
    if costs.cost is None:
        return []
    headers = [(b"x-draftgate-cost-usd", b"%.9f" % costs.cost)]
    if costs.cost_error is not None:
        headers.append((b"x-draftgate-cost-95-usd", b"%.9f" % costs.cost_error))
    if costs.source is not None:
        headers.append((b"x-draftgate-cost-source", costs.source.encode()))
    return headers


def _hold_done(data: bytes, held: bytes) -> tuple[bytes, bytes]:
    """`data` to forward now, and what is held back: from a closing `data: [DONE]` event on
    (whole events only reach here, so it starts a line)."""
    if held:
        return b"", held + data
    at = data.rfind(DONE)
    if at < 0 or data[at:].strip() != DONE or (at and data[at - 1 : at] != b"\n"):
        return data, held
    return data[:at], data[at:]


def _usage_of(content: bytes) -> dict[str, Any] | None:
    try:
        body = orjson.loads(content)
    except orjson.JSONDecodeError:
        return None
    usage = body.get("usage") if isinstance(body, dict) else None
    return usage if isinstance(usage, dict) else None


def _interrupted(message: str) -> UpstreamError:
    return UpstreamError(message, code="stream_interrupted")


def keyless_door(headers: dict[bytes, bytes], hosts: frozenset[bytes]) -> None:
    """Without API keys: the request must name a listed host and declare a JSON body (a page
    on another site can send neither: a form posts no JSON type, a rebound name its own host)."""
    if host_name(headers.get(b"host", b"")) not in hosts:
        raise HostNotAllowed(
            "Host not allowed: without API keys the gateway answers only the hosts in "
            "DRAFTGATE_KEYLESS_ALLOWED_HOSTS"
        )
    if b"content-type" not in headers:
        raise UnsupportedMediaType(
            "Content-Type must be application/json (required when API keys are not)"
        )


def host_name(host: bytes) -> bytes:
    """The name in a Host header, lower-case, without its port: `[::1]:8080` is `::1`."""
    if host.startswith(b"["):
        return host[1 : host.find(b"]")].lower()
    return host.partition(b":")[0].lower()


def _sse_error(error: GatewayError, request_id: str) -> bytes:
    """The event that ends a stream cut short with `error`."""
    body = error.envelope()
    body["error"]["request_id"] = request_id
    return b"data: " + orjson.dumps(body) + b"\n\ndata: [DONE]\n\n"


async def _end_cut_stream(x: Exchange, stream: bool, send: Send) -> None:
    """End a stream cancelled by the server (shutdown) with an SSE error event, if started."""
    started = stream and x.status != 0 and not x.responded  # the response head went out
    x.status, x.outcome = 503, "shutdown"
    if not started:
        return
    x.responded = True
    event = _sse_error(_interrupted("gateway shutting down; the stream was cut"), x.request_id)
    try:
        await send({"type": "http.response.body", "body": event, "more_body": False})
    except OSError:  # the connection is already gone
        logger.debug("client left before the shutdown event")


async def _end_failed(x: Exchange, send: Send) -> None:
    """Answer a request the gateway itself failed: a 500 envelope, or, once its response
    has begun, an SSE error event (a whole response's head and body go out together)."""
    started = x.status != 0 and not x.responded
    x.status, x.outcome = 500, "gateway_error"
    if x.responded:
        return
    error = GatewayError("The gateway failed to relay this request", code="internal_error")
    if not started:
        await _send_error(send, error, x.request_id)
        return
    x.responded = True
    event = _sse_error(error, x.request_id)
    try:
        await send({"type": "http.response.body", "body": event, "more_body": False})
    except OSError:
        logger.debug("client left before the error event")


async def _send_error(send: Send, error: GatewayError, request_id: str) -> None:
    body = orjson.dumps(error.envelope())
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"x-request-id", request_id.encode()),
    ]
    if error.retry_after_s is not None:
        headers.append((b"retry-after", str(error.retry_after_s).encode()))
    if isinstance(error, BodyTooLarge):  # the rest of the body is never read: close
        headers.append((b"connection", b"close"))
    try:
        await send({"type": "http.response.start", "status": error.status_code, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})
    except OSError:  # the client is gone; the ledger still records the request
        logger.debug("client left before the error response")


class Departure:
    """Cancels a request's task when its client disconnects while a backend serves it.

    Under the gateway's own server protocol (gateway/server/http_limits.py) the lost connection
    calls `left` through the scope; under another ASGI server (a test's in-process
    transport) a task waits on `receive` for the disconnect instead. Between attempts it
    holds neither the task nor its hook, so a finished request leaves no reference cycle
    for the garbage collector to find (its full passes pause the event loop)."""

    __slots__ = ("_hook", "_receive", "_scope", "_task", "_watcher", "_x", "happened")

    def __init__(self, scope: Scope, receive: Receive, exchange: Exchange) -> None:
        self._scope, self._receive, self._x = scope, receive, exchange
        self._task: asyncio.Task[Any] | None = None
        self._watcher: asyncio.Future[None] | None = None
        self._hook: Callable[[], None] | None = None
        self.happened = False

    def arm(self) -> None:
        """Watch from now on (an attempt has begun)."""
        self._task = asyncio.current_task()
        hook = self._scope.get(ON_DISCONNECT, self)
        if hook is self:  # not our server: wait for the disconnect message
            self._watcher = asyncio.ensure_future(self._wait())
        elif hook == LOST:  # it left before this attempt began
            self.left()
        else:
            self._hook = self._scope[ON_DISCONNECT] = self.left

    def disarm(self) -> None:
        """Stop watching (the attempt is over)."""
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None
        elif self._hook is not None and self._scope.get(ON_DISCONNECT) is self._hook:
            self._scope[ON_DISCONNECT] = None
        self._hook = self._task = None

    def left(self) -> None:
        """The client disconnected: cancel the request unless it was already answered."""
        self.happened = True
        if self._task is not None and not self._x.responded:
            self._task.cancel()

    async def _wait(self) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            pass
        self.left()
