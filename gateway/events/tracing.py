"""OpenTelemetry tracing (the `otel` extra): spans of relayed requests and admin changes.

Imported only when `DRAFTGATE_TRACING` is on (the app imports it lazily), so with tracing off
no process loads the SDK and the relay does no tracing work: its `tracing` is None.

Per relayed request one SERVER span continues the client's W3C trace context, and the backend
receives that span's context as its `traceparent` (replacing the client's own), so a traced
vLLM's spans are its children; an attempt that fails before the response is an event on it.
One span, not a CLIENT child per attempt as well: each costs the relay about 40 us to make
and the exporter as much to encode (bench/README.md). Admin changes get a SERVER span per
request and an INTERNAL span per audit entry committed, the selector's automatic moves
included. Spans go to an OTLP/HTTP collector in batches from the SDK's own thread.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

if TYPE_CHECKING:
    from gateway.db.tables import AuditEntry
    from gateway.errors import GatewayError
    from gateway.registry import BackendView
    from gateway.settings import Settings

logger = logging.getLogger(__name__)
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

TRACE_HEADERS = ("traceparent", "tracestate")  # W3C trace context
INCOMING = tuple((name, name.encode()) for name in TRACE_HEADERS)  # as ASGI names them
# OpenTelemetry's GenAI names for the endpoints that have one.
OPERATIONS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "text_completion",
    "/v1/embeddings": "embeddings",
    "/v1/responses": "chat",
    "/v1/messages": "chat",
}
READS = frozenset({"GET", "HEAD", "OPTIONS"})
ADMIN_PREFIX = "/admin/v1"  # where the app mounts the admin routes
MAX_BATCH_SPANS = 512  # the SDK's default export batch


class Tracing:
    """The gateway's tracer: starts and ends its spans; `shutdown` exports what is left."""

    def __init__(
        self, provider: TracerProvider, relayed: frozenset[str], shutdown_timeout_s: float = 10.0
    ) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("draftgate")
        self.propagator = TraceContextTextMapPropagator()
        self.relayed = relayed
        self.shutdown_timeout_s = shutdown_timeout_s

    def start_request(self, path: str, headers: dict[bytes, bytes], trusted: bool = True) -> Span:
        """The SERVER span of a relayed request, continuing the client's trace if it sent one
        and is `trusted` (it has a key, or keys are not required): a parent's sampled flag
        overrides the sample ratio, which a caller without a key must not decide."""
        parent = self._parent(headers) if trusted else None
        attributes: dict[str, str] = {"http.request.method": "POST", "url.path": path[:200]}
        name = "POST"
        if path in self.relayed:  # only known routes name a span: bounded names
            name, attributes["http.route"] = f"POST {path}", path
        if path in OPERATIONS:
            attributes["gen_ai.operation.name"] = OPERATIONS[path]
        return self.tracer.start_span(name, parent, kind=SpanKind.SERVER, attributes=attributes)

    def inject(self, span: Span, headers: dict[str, str]) -> None:
        """Put `span`'s trace context in `headers`, a request to a backend, in place of the
        client's."""
        for name in TRACE_HEADERS:
            headers.pop(name, None)
        self.propagator.inject(headers, trace.set_span_in_context(span))

    def attempt_failed(self, span: Span, backend: BackendView, error: GatewayError) -> None:
        """Note on a request's span an attempt that failed before the response began."""
        attributes = {
            "draftgate.backend": backend.name,
            "error.type": error.code or error.error_type,
            "exception.message": error.message[:200],
        }
        span.add_event("draftgate.attempt_failed", attributes)

    def end_request(
        self,
        span: Span | None,
        attributes: Mapping[str, str | int | float | bool],
        status: int,
        outcome: str,
    ) -> None:
        """End a relayed request's span with what the ledger records of it (the relay says
        what: gateway/relay/spans.py)."""
        if span is None:
            return
        if span.is_recording():
            span.set_attributes(attributes)
            if status >= 500:  # the client's disconnect (499) or error (4xx) is no failure
                span.set_attribute("error.type", outcome)
                span.set_status(Status(StatusCode.ERROR, outcome))
        span.end()

    def is_admin_change(self, scope: Scope) -> bool:
        """Whether an HTTP request is one to the admin API that may change something."""
        return scope["path"].startswith(ADMIN_PREFIX + "/") and scope["method"] not in READS

    async def serve_admin(self, scope: Scope, receive: Receive, send: Send, app: App) -> None:
        """Serve an admin change inside its SERVER span (the audit entries' parent)."""
        method, parent = scope["method"], self._parent(dict(scope["headers"]))
        attributes = {"http.request.method": method, "url.path": scope["path"][:500]}
        span = self.tracer.start_span(method, parent, kind=SpanKind.SERVER, attributes=attributes)
        status = 0

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        with trace.use_span(span, end_on_exit=True):
            try:
                await app(scope, receive, sending)
            finally:
                _end_admin(span, scope, method, status)

    def audited(self, entry: AuditEntry) -> None:
        """An INTERNAL span for one committed audit entry, a child of the change's request
        span when there is one (the selector's moves start traces of their own)."""
        attributes: dict[str, str | int] = {
            "draftgate.audit.id": entry.id,
            "draftgate.audit.actor": entry.actor,
            "draftgate.audit.action": entry.action,
            "draftgate.audit.resource_type": entry.resource_type,
            "draftgate.audit.resource_id": entry.resource_id[:200],
        }
        name = f"audit {entry.action} {entry.resource_type}"
        self.tracer.start_span(name, kind=SpanKind.INTERNAL, attributes=attributes).end()

    def _parent(self, headers: dict[bytes, bytes]) -> Context | None:
        """The trace context a request came with, if any (an invalid one starts a new trace)."""
        carrier = {n: v.decode("latin-1") for n, raw in INCOMING if (v := headers.get(raw))}
        return self.propagator.extract(carrier) if carrier else None

    def shutdown(self) -> None:
        """Export the spans still queued and stop, waiting at most `shutdown_timeout_s` (the
        SDK would wait 30 s for a collector that does not answer)."""
        stopping = threading.Thread(target=self.provider.shutdown, name="tracing-stop", daemon=True)
        stopping.start()
        stopping.join(self.shutdown_timeout_s)
        if stopping.is_alive():
            logger.warning("spans still queued after %.0f s were dropped", self.shutdown_timeout_s)


def _end_admin(span: Span, scope: Scope, method: str, status: int) -> None:
    route = getattr(scope.get("route"), "path", None)  # FastAPI's matched route, once routed
    if isinstance(route, str):
        # Recent FastAPI keeps an included router's routes apart: their paths lack its prefix.
        route = route if route.startswith(ADMIN_PREFIX + "/") else ADMIN_PREFIX + route
        span.update_name(f"{method} {route}")
        span.set_attribute("http.route", route)
    if status:
        span.set_attribute("http.response.status_code", status)
    if status >= 500 or not status:
        span.set_status(Status(StatusCode.ERROR, f"status {status or 'none'}"))


def start_tracing(settings: Settings, version: str) -> Tracing:
    """A tracer exporting to `settings.otel_endpoint`, every value from the settings (the
    SDK's own OTEL_* variables for them are not read)."""
    resource = Resource(
        {
            "service.name": settings.otel_service_name,
            "service.version": version,
            "service.instance.id": uuid.uuid4().hex,  # one per process: replicas apart
        }
    )
    sampler = ParentBased(TraceIdRatioBased(settings.otel_sample_ratio))
    provider = TracerProvider(sampler=sampler, resource=resource, shutdown_on_exit=False)
    exporter = OTLPSpanExporter(
        endpoint=settings.otel_endpoint,
        headers=export_headers(settings),
        timeout=settings.otel_export_timeout_s,
        compression=Compression.NoCompression,
    )
    processor = BatchSpanProcessor(
        exporter,
        max_queue_size=settings.otel_max_queue_spans,
        schedule_delay_millis=settings.otel_export_interval_s * 1000,
        max_export_batch_size=min(MAX_BATCH_SPANS, settings.otel_max_queue_spans),
        export_timeout_millis=settings.otel_export_timeout_s * 1000,
    )
    provider.add_span_processor(processor)
    logger.info("tracing on: spans to %s", settings.otel_endpoint)
    return Tracing(provider, settings.relayed, settings.otel_export_timeout_s)


def export_headers(settings: Settings) -> dict[str, str]:
    """`otel_headers` as a dict: `name=value` pairs, comma-separated, values URL-encoded."""
    if settings.otel_headers is None:
        return {}
    pairs = (p.partition("=") for p in settings.otel_headers.get_secret_value().split(","))
    return {n.strip().lower(): unquote(v.strip()) for n, sep, v in pairs if sep and n.strip()}
