"""The relay: a plain ASGI callable for `POST /v1/*`, kept off FastAPI's request machinery.

Per request: authenticate the key (from its header, before any of the body is read), read
and check the body, check the key's model and limits (memory only), route, then stream the
backend's bytes through as they arrive. Failures before the first byte reaches the client are
retried on the next backend, except a whole (non-streamed) response that outlasts the read
timeout: its backend accepted it and worked on it, so it is answered 504 and charged an
estimate of that work. A stream that breaks later ends with an SSE error event. Every request
that names its model ends in exactly one ledger record; one refused before (for its key, or
for a body without a model) ends in none, counted in `draftgate_rejections`.
"""

# Over 400 lines: one request read top to bottom, from its first byte to its ledger record;
# its parts (checks, routing, headers, endings, departure) live in their own modules.

from __future__ import annotations

import asyncio
import logging
import random
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

import orjson

from gateway.accounting import Ledger
from gateway.errors import (
    GatewayError,
    InvalidApiKey,
    InvalidRequest,
    ModelNotAllowed,
    ModelNotFound,
    PoisonRequest,
    ResponseNotFound,
    ServiceUnavailable,
    TeamNotFound,
    UnknownPath,
    UpstreamError,
    UpstreamTimeout,
)
from gateway.homes import RESPONSES_PATH, Home, ResponseHomes, checked_id, not_found
from gateway.limits import Limiter
from gateway.metrics import GatewayMetrics
from gateway.policy.affinity import Affinity, later_turn, session_key
from gateway.policy.rules import CLASS_HEADER, first_match
from gateway.policy.rules import Request as RuleRequest
from gateway.registry import BackendState, BackendView, KeyView, PolicyView, Registry
from gateway.relay.asgi import ClientGone, Receive, Scope, Send
from gateway.relay.attribution import end_user, tags
from gateway.relay.checks import (
    COMPLETION_PATHS,
    INCLUDE_COST_HEADER,
    INCLUDE_SPECULATION_HEADER,
    RefusalHold,
    UsageAsked,
    authenticate,
    bearer_token,
    body_bound,
    check_completion,
    has_key,
    keyless_door,
    may_use,
    parse_body,
    prompt_estimate,
    read_body,
    request_class,
    usage_asked,
    with_priority,
    with_usage_options,
)
from gateway.relay.departure import Departure
from gateway.relay.endings import end_cut_stream, end_failed, interrupted, send_error, sse_error
from gateway.relay.exchange import Exchange, admit, estimate_abandoned, settle
from gateway.relay.fairshare import FairShare
from gateway.relay.headers import (
    cost_comment,
    cost_headers,
    limit_headers,
    response_headers,
    upstream_headers,
)
from gateway.relay.routing import Route, route_request
from gateway.relay.shadow import REPLAY, REPLAY_CLASS, ReplayOrder, Shadow
from gateway.relay.spans import end_span
from gateway.relay.sse import UsageTap, closes, hold_done
from gateway.relay.tokens import Tokens, looks_like_jwt
from gateway.relay.transcripts import (
    asks_token_ids,
    cut_body_token_ids,
    cut_token_ids,
    with_token_ids,
)
from gateway.relay.upstream import (
    Upstream,
    UpstreamBroke,
    UpstreamResponse,
    UpstreamTimedOut,
    UpstreamUnreachable,
)
from gateway.server.http_limits import STALLED
from gateway.settings import Settings
from gateway.usage import (
    cut_speculation,
    json_body,
    response_id_in,
    speculation_in,
    tokens_of,
    usage_in,
)

if TYPE_CHECKING:
    from gateway.events.tracing import Tracing

logger = logging.getLogger(__name__)

REQUEST_ID = re.compile(rb"^[A-Za-z0-9._:-]{1,64}$")  # usage_records.request_id is 64 chars


@dataclass(slots=True)
class Call:
    """One request on its way to a backend: what each step of relaying it reads."""

    x: Exchange
    path: str
    body: bytes  # as sent to the backend
    stream: bool
    asked: UsageAsked  # the usage (and cost) the client asked of a stream
    departure: Departure
    send: Send
    occupied: BackendState | None = None  # the backend serving it, until its answer is read
    # The body asking for the answer's token ids too, for the lossless watchdog: sent to a
    # backend that serves its engine's `/version`; `cut_ids`: they go to no client as asked
    ids_body: bytes | None = None
    cut_ids: bool = False

    def release(self) -> None:
        """The backend is done with it (its whole answer read): one request fewer in flight
        there. Before the answer goes on to the client, so a conversation's next turn, sent
        the moment this one arrives, finds its backend as free as it is."""
        if self.occupied is not None:
            self.occupied.end(time.monotonic())
            self.occupied = None


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
        homes: ResponseHomes,
        tracing: Tracing | None = None,
        shadow: Shadow | None = None,
        tokens: Tokens | None = None,
    ) -> None:
        self.settings = settings
        self.tokens = tokens  # bearer JWTs' checks, when an issuer is configured
        self.shadow = shadow  # the lossless watchdog's sampler, when it samples
        self.homes = homes
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
        self.user_header, self.tags_header = settings.user_header_name, settings.tags_header_name
        self.classes = settings.classes
        self.hold_refusal = RefusalHold(settings.refused_key_delay_s)
        self.fair: FairShare | None = None  # the fair-share queues, when they are on
        if settings.fair_share:
            self.fair = FairShare(
                registry.states, metrics, settings.fair_queue_max, settings.fair_queue_timeout_s
            )
        self.class_priority = settings.class_priority

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope["headers"])
        supplied = headers.get(b"x-request-id", b"")
        exchange = Exchange(supplied.decode() if REQUEST_ID.match(supplied) else "")
        exchange.request_id = exchange.request_id or exchange.ledger_id
        rid = exchange.request_id
        if self.tracing is not None:  # a caller without a key may not choose to be sampled
            trusted = not self.settings.require_api_key or has_key(headers, self.registry.snapshot)
            exchange.span = self.tracing.start_request(scope["path"], headers, trusted)
        try:
            await self._handle(scope, headers, exchange, receive, send)
        except GatewayError as error:
            exchange.status = error.status_code
            exchange.outcome = "rejected" if exchange.backend is None else "upstream_error"
            if exchange.refusal is not None:
                await self.hold_refusal()
            await send_error(send, error, rid, unread=exchange.refusal is not None)
        except ClientGone:
            stalled = scope.get(STALLED, False)  # cut by the server: it stopped reading
            exchange.status = 499
            exchange.outcome = "client_stalled" if stalled else "client_disconnect"
        except Exception:  # the top of the relay: a bug is a 500 envelope and a record
            logger.exception("request %s failed in the gateway", rid)
            await end_failed(exchange, send)
        finally:
            if exchange.ticket is not None:  # room for the next waiting request
                served = tokens_of(exchange.usage)
                exchange.ticket.served(served.prompt, served.completion)
                exchange.ticket.done()
            try:
                settle(exchange, self.ledger, self.limiter, self.metrics)
            except Exception:  # the top of the relay: accounting must not drop the connection
                logger.exception("settling request %s failed", exchange.request_id)
            if exchange.response_id is not None and exchange.backend is not None:
                key = exchange.key
                owner = (None, None) if key is None else (key.api_key_id, key.team_id)
                self.homes.remember(exchange.response_id, Home(exchange.backend.name, *owner))
            if self.tracing is not None:
                end_span(exchange, self.tracing)
            if exchange.sample is not None and self.shadow is not None:
                self.shadow.offer(exchange)  # after the record: its replay comes later

    async def _handle(
        self, scope: Scope, headers: dict[bytes, bytes], x: Exchange, receive: Receive, send: Send
    ) -> None:
        """Read and check the request, authorize it, say how it routes, admit it, forward it."""
        path = scope["path"]
        if path not in self.relayed:  # an exact list: no dot segments, no operator routes
            raise UnknownPath(f"Unknown path {path[:100]!r}")
        order: ReplayOrder | None = scope.get(REPLAY)  # the watchdog's own replay: no key
        x.snapshot = self.registry.snapshot  # the request's only read of it
        x.choices = self.registry.choices  # and of these
        if order is None:  # the key is in a header: without one, no body read and no record
            x.key = await self._authenticate(headers, x)
        body = await read_body(headers, receive, body_bound(x.key, self.settings.max_body_bytes))
        payload = parse_body(body, self.settings.max_json_depth)
        model = payload.get("model")
        if not isinstance(model, str) or not model:
            raise InvalidRequest("you must provide a model parameter", param="model")
        x.model = model
        self._attribute(x, headers, path, payload)
        x.forward = {
            n.decode(): v.decode("latin-1") for n in self.forwarded if (v := headers.get(n))
        }
        self._check_model(x, model)
        if path in COMPLETION_PATHS:
            check_completion(path, payload)
        elif path == RESPONSES_PATH and payload.get("previous_response_id") is not None:
            x.home = await self._home(x, payload["previous_response_id"])
        self._say_how_it_routes(
            x, headers, path, payload, len(body), x.snapshot.policies.get(model)
        )
        ids_body = None  # the body asking for token ids, for the watchdog's comparison
        if order is not None or self.shadow is not None:
            ids_body = self._replay_or_sample(x, order, path, payload)
        stream = payload.get("stream") is True
        asked = usage_asked(
            path,
            payload,
            headers.get(INCLUDE_COST_HEADER, b""),
            headers.get(INCLUDE_SPECULATION_HEADER, b""),
        )
        if stream and path in COMPLETION_PATHS:
            body = with_usage_options(payload)
        states, limit = self.registry.states, self.settings.default_max_model_len
        admit(x, path, payload, len(body), states, limit, self.limiter, self.metrics)
        departure = Departure(scope, receive, x)
        await self._let_in(x, path, payload, len(body), departure)  # its turn, when full
        call = Call(x, path, body, stream, asked, departure, send, ids_body=ids_body)
        try:
            await self._forward(call)
        except (ClientGone, UpstreamTimeout):
            if not stream:  # the backend never said what it generated: estimate it
                estimate_abandoned(x, path, payload, len(body), limit)
            raise

    def _check_model(self, x: Exchange, model: str) -> None:
        """The request's key may use its model, and the model has a backend."""
        assert x.snapshot is not None
        try:
            may_use(x.key, model)
        except ModelNotAllowed as refusal:
            self.metrics.rejections.labels(refusal.code).inc()
            raise
        if not x.snapshot.backends.get(model):
            message = f"The model `{model}` does not exist or has no enabled backend"
            raise ModelNotFound(message, param="model")

    async def _let_in(
        self,
        x: Exchange,
        path: str,
        payload: dict[str, Any],
        body_bytes: int,
        departure: Departure,
    ) -> None:
        """Into the model's backends now, or once it is the request's turn among teams
        (while they are full)."""
        fair = self.fair
        if fair is None:
            return
        assert x.snapshot is not None
        assert x.model is not None
        key, limit = x.key, self.settings.default_max_model_len
        team = 0 if key is None else key.id if key.team_id is None else -key.team_id
        try:
            x.ticket = await fair.enter(
                x.snapshot, x.model, team, x.priority or 0,
                lambda: prompt_estimate(path, payload, body_bytes, limit), departure,
            )  # fmt: skip
        except asyncio.CancelledError as exc:
            if departure.happened:  # its client left while it waited
                raise ClientGone from exc
            raise

    def _attribute(
        self, x: Exchange, headers: dict[bytes, bytes], path: str, payload: dict[str, Any]
    ) -> None:
        """Who the request is attributed to beside its key: its end user, tags, endpoint."""
        x.endpoint = path
        user = headers.get(self.user_header, b"") if self.user_header else b""
        x.end_user = x.end_user or end_user(user, payload)  # a token's user comes first
        x.tags = tags(headers.get(self.tags_header, b""))

    async def _authenticate(self, headers: dict[bytes, bytes], x: Exchange) -> KeyView | None:
        """The request's key (None: keys are not required and it sent none), from a host
        that may call without one when keys are not required; or, for a bearer JWT, its
        team (and its end user, set on `x`)."""
        assert x.snapshot is not None
        if self.keyless_hosts is not None:
            keyless_door(headers, self.keyless_hosts)
        try:
            token = bearer_token(headers)
            if self.tokens is not None and looks_like_jwt(token):
                key, x.end_user = await self.tokens.caller(token, x.snapshot)
                return key
            return authenticate(headers, x.snapshot, self.settings.require_api_key)
        except (InvalidApiKey, TeamNotFound, ServiceUnavailable) as refusal:
            x.refusal = refusal.code
            raise

    def _replay_or_sample(
        self, x: Exchange, order: ReplayOrder | None, path: str, payload: dict[str, Any]
    ) -> bytes | None:
        """A watchdog's replay runs on its reference method alone, recorded as a replay; any
        other request may be sampled for one. Either asks for its answer's token ids: the
        body that does (None: neither, or the client asked for them itself)."""
        if order is not None:
            order.exchange, x.pinned, x.request_class = x, order.method, REPLAY_CLASS
            x.rule = x.affinity = None
        elif self.shadow is not None:
            x.sample = self.shadow.sample(path, payload, x.key)
        if (x.sample is None and order is None) or asks_token_ids(payload):
            return None
        stream = payload.get("stream") is True and path in COMPLETION_PATHS
        return _body(with_token_ids(payload), stream)

    async def _home(self, x: Exchange, previous: object) -> BackendView | None:
        """The backend holding the response a later turn continues (None: no replica has
        recorded it, so it goes where any request would); a 404 when it is another key's,
        or its backend no longer serves."""
        param = "previous_response_id"
        response_id = checked_id(previous, param)
        home = await self.homes.find(response_id)
        if home is None:
            return None
        if not home.owned_by(x.key):
            raise not_found(response_id, param)
        assert x.snapshot is not None
        assert x.model is not None
        for backend in x.snapshot.backends.get(x.model, ()):
            if backend.name == home.backend:
                return backend
        raise ResponseNotFound(
            f"Response with id '{response_id}' was stored on backend `{home.backend}`, which "
            f"no longer serves `{x.model}`: it is gone with that server. Send the "
            "conversation again as `input`.",
            param=param,
        )

    def _say_how_it_routes(
        self,
        x: Exchange,
        headers: dict[bytes, bytes],
        path: str,
        payload: dict[str, Any],
        body_bytes: int,
        policy: PolicyView | None,
    ) -> None:
        """The request's class and priority, the first of its model's rules it matches, its
        session."""
        x.request_class = own = request_class(headers.get(CLASS_HEADER), x.key, self.classes)
        x.priority = self.class_priority.get(own)
        if x.priority is None:  # its team's, else 0
            assert x.snapshot is not None
            team = x.key.team_id if x.key is not None else None
            share = x.snapshot.team_shares.get(team) if team is not None else None
            x.priority = share.priority if share is not None else 0
        if policy is not None and policy.rules:  # no rules, no cost
            prompt = prompt_estimate(path, payload, body_bytes, self.settings.default_max_model_len)
            x.rule = first_match(policy.rules, RuleRequest(payload, own, prompt))
        if self.settings.affinity:
            header = headers.get(self.affinity_header, b"")
            found = session_key(header, payload, self.settings.affinity_prefix_chars)
            if found is not None:
                held = found[1] != "prefix" or later_turn(payload)
                x.affinity = Affinity(found[0], self.settings.affinity_balance, held)

    async def _forward(self, call: Call) -> None:
        """Try the route's backends in order until one serves: a failure before anything
        reached the client moves on. A 5xx alike from two backends each seen serving other
        requests meanwhile is the request's own (poison): it is not tried further. From a
        backend not seen serving (it may be sick) it proves nothing, and the rest are tried."""
        x = call.x
        plan = route_request(
            x, self.registry.states, self.rng, time.monotonic(), time.time(),
            self.settings.max_attempts, spill=self.settings.spill,
        )  # fmt: skip
        self._count_route(x, plan)
        last_error: GatewayError | None = None
        suspects: list[tuple[BackendState, _Retryable]] = []  # backends that 5xx'd it, in order
        since = time.monotonic()
        for attempt, backend in enumerate(plan.backends):
            if attempt:
                self.metrics.retries.labels(x.model).inc()
            try:
                await self._attempt(call, backend, plan.fallback)
            except _Retryable as retryable:
                last_error = retryable.error
                if retryable.answered is not None:
                    suspects.append((retryable.answered, retryable))
                    if _poison(suspects, since, every=False):
                        self._poisoned(x.model, suspects)
                continue
            except UpstreamTimeout:  # accepted, then too slow: no other backend tries it
                for state, _ in suspects:
                    self._record_failure(state)
                raise
            for state, _ in suspects:  # another backend served what they failed
                self._record_failure(state)
            return
        if _poison(suspects, since, every=True):  # failed alike wherever it went
            self._poisoned(x.model, suspects)
        for state, _ in suspects:  # no other backend served it: the failure stays theirs
            self._record_failure(state)
        if plan.panic or last_error is None:
            detail = f" (last: {last_error.message})" if last_error else ""
            message = f"No healthy backend for model `{x.model}`; retry shortly{detail}"
            raise ServiceUnavailable(message, code="no_healthy_backend", retry_after_s=5)
        raise last_error

    def _poisoned(
        self, model: str | None, suspects: list[tuple[BackendState, _Retryable]]
    ) -> NoReturn:
        """The request is its own failure's cause: answered 502, no backend blamed."""
        self.metrics.poison_requests.labels(model).inc()
        raise PoisonRequest(
            f"The request failed on {len(suspects)} backends alike "
            f"({suspects[-1][1].error.message}); it is not retried"
        ) from None

    def _count_route(self, x: Exchange, plan: Route) -> None:
        """Say how the request routes: on its record and in the metrics."""
        if plan.affinity is not None:
            x.affinity_outcome = plan.affinity
            self.metrics.affinity_routes.labels(x.model, plan.affinity).inc()
        if x.rule is not None:
            self.metrics.rule_matches.labels(x.model, str(x.rule.index)).inc()
        x.explored = plan.explored
        if plan.fallback:
            x.fallback = plan.fallback
            self.metrics.fallbacks.labels(x.model, plan.fallback).inc()
        if plan.panic:
            self.metrics.panic_routes.labels(x.model).inc()

    async def _attempt(self, call: Call, backend: BackendView, fallback: str | None) -> None:
        """Send the request to one backend and relay its answer to the client."""
        x, departure = call.x, call.departure
        state = self.registry.states[backend.name]
        x.backend, x.method = backend, backend.method
        x.attempts += 1
        state.begin(time.monotonic())
        call.occupied = state
        x.concurrency = state.load()  # the backend's load, alike on every replica
        upstream = upstream_headers(x, backend)
        if self.tracing is not None and x.span is not None:  # the backend continues our span
            self.tracing.inject(x.span, upstream)
        departure.arm()
        x.sent = time.perf_counter()
        body, call.cut_ids = call.body, False
        if call.ids_body is not None and state.engine_version:  # vLLM's, which serves it
            body, call.cut_ids = call.ids_body, x.sample is not None
        if backend.priority_scheduling:  # the gateway's priority, never a client's own
            body = with_priority(body, x.priority or 0)
        try:
            url, stream = backend.url + call.path, call.stream
            response = await self._send_upstream(url, body, upstream, state, stream)
            try:
                headers = response_headers(response, backend, fallback, x)
                headers += limit_headers(x, self.limiter)
                if stream and response.status_code < 400:
                    await self._relay_stream(call, response, headers)
                else:
                    await self._relay_whole(call, response, headers)
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
            await end_cut_stream(x, call.stream, call.send)  # the shutdown grace ran out
            raise
        finally:
            departure.disarm()
            call.release()

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
            raise _Retryable(error, answered=state, status=response.status_code)
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
        if response.status_code < 400:
            state.served_at = time.monotonic()  # alive and serving: see _poison
        return response

    def _record_failure(self, state: BackendState) -> None:
        state.failures += 1
        if state.failures >= self.settings.breaker_failures:
            state.open_until = time.monotonic() + self.settings.breaker_cooldown_s

    async def _relay_stream(
        self, call: Call, response: UpstreamResponse, headers: list[tuple[bytes, bytes]]
    ) -> None:
        """Pass a stream's events on as they come, its usage read (and cut where the client
        did not ask for it) on the way; a stream the backend breaks ends with an error event."""
        x, asked, send = call.x, call.asked, call.send
        x.status = response.status_code
        await send({"type": "http.response.start", "status": x.status, "headers": headers})
        tap = UsageTap(
            strip_usage_chunk=not asked.final,
            strip_chunk_usage=not asked.every_chunk,
            strip_speculation=not asked.speculation,
            named_events=call.path not in COMPLETION_PATHS,
        )
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
                if call.cut_ids:
                    out = cut_token_ids(out)
                if asked.cost:
                    out, held = hold_done(out, held)
                if out:
                    await send({"type": "http.response.body", "body": out, "more_body": True})
                    # the client has it all: closing now, as clients do, is no disconnect
                    x.responded = x.responded or closes(out)
                if x.sample is not None:
                    x.sample.transcript.feed(chunk)
            call.release()
            rest = _finish(tap, call)
            if asked.cost:
                rest, held = hold_done(rest, held)
                rest += cost_comment(x, tap, self.metrics) + held
            x.responded = True
            await send({"type": "http.response.body", "body": rest, "more_body": False})
        except (UpstreamBroke, UpstreamTimedOut) as exc:  # the backend broke mid-stream
            x.outcome, x.status = "upstream_error", 502
            if x.backend is not None:
                self._record_failure(self.registry.states[x.backend.name])
            broke = interrupted(f"backend stream broke: {exc}")
            event = tap.finish()
            if asked.cost:
                event += cost_comment(x, tap, self.metrics)
            event += sse_error(broke, x.request_id)
            x.responded = True
            await send({"type": "http.response.body", "body": event, "more_body": False})
        finally:
            tap.finish()  # a stream cut short still knows its usage from its last chunk
            x.usage, x.chunks, x.speculation = tap.usage, tap.chunks, tap.speculation
            if call.path == RESPONSES_PATH:
                x.response_id = tap.response_id()

    async def _relay_whole(
        self, call: Call, response: UpstreamResponse, headers: list[tuple[bytes, bytes]]
    ) -> None:
        """Pass a whole response on, with its cost in its headers."""
        x, send = call.x, call.send
        try:
            content = await response.aread()
        except (UpstreamBroke, UpstreamTimedOut) as exc:  # head, then no whole body
            if x.backend is not None:
                self._record_failure(self.registry.states[x.backend.name])
            if isinstance(exc, UpstreamTimedOut):
                raise UpstreamTimeout(f"backend timed out: {exc}") from exc
            raise UpstreamError(f"backend broke: {exc}") from exc
        call.release()
        x.status = response.status_code
        x.first_byte = x.last_byte = time.perf_counter()
        if x.status >= 400:
            x.outcome = "upstream_error" if x.status >= 500 else "client_error"
        body = json_body(content)
        x.usage, x.speculation = usage_in(body), speculation_in(body)
        if x.sample is not None:
            x.sample.transcript.whole(body)
        if body is not None and _cut_asked(body, call):
            content = orjson.dumps(body)  # the gateway asked for these, not the client
        if call.path == RESPONSES_PATH and x.status == 200:
            x.response_id = response_id_in(body)
        headers.append((b"content-length", str(len(content)).encode()))
        headers += cost_headers(x, self.metrics)
        await send({"type": "http.response.start", "status": x.status, "headers": headers})
        x.responded = True
        await send({"type": "http.response.body", "body": content, "more_body": False})


def _finish(tap: UsageTap, call: Call) -> bytes:
    """What a stream's tap held back to its end (an unfinished last event), the token ids
    the gateway asked for cut out of it too."""
    rest = tap.finish()
    return cut_token_ids(rest) if call.cut_ids else rest


def _cut_asked(body: dict[str, Any], call: Call) -> bool:
    """Whether what the gateway asked for and the client did not (the speculative decoding
    block, the token ids) was cut out of a whole answer."""
    cut = not call.asked.speculation and cut_speculation(body)
    if call.cut_ids:
        cut_body_token_ids(body)
    return cut or call.cut_ids


def _body(payload: dict[str, Any], usage_options: bool) -> bytes:
    """A request's body as sent: with usage asked of the stream where it is a completion's."""
    return with_usage_options(payload) if usage_options else orjson.dumps(payload)


class _Retryable(Exception):
    """A failure before anything reached the client: the next backend may serve."""

    def __init__(
        self,
        error: UpstreamError | UpstreamTimeout,
        answered: BackendState | None = None,
        status: int = 0,
    ) -> None:
        super().__init__(error.message)
        self.error = error  # the answer, should no backend serve
        self.answered = answered  # the backend that answered with a 5xx (alive, but failed)
        self.status = status  # that 5xx


def _poison(suspects: list[tuple[BackendState, _Retryable]], since: float, every: bool) -> bool:
    """Whether the backends' 5xx answers prove the request is poison: two or more, all of
    one status, and (before `every` backend was tried) each from a backend seen serving
    another request since this one was first sent (`since`, monotonic): two sick backends
    failing alike prove nothing while a third may serve."""
    if len(suspects) < 2 or len({failed.status for _, failed in suspects}) > 1:
        return False
    return every or all(state.served_at > since for state, _ in suspects)


def _record_success(state: BackendState) -> None:
    state.failures = 0
