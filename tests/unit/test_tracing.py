"""The tracing module's own pieces: spans, attributes, trace context and settings."""

from __future__ import annotations

import sys

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from pydantic import ValidationError

import gateway.events
from gateway.app import start_tracing
from gateway.errors import UpstreamError
from gateway.events.tracing import Tracing, export_headers
from gateway.registry import BackendView
from gateway.relay.exchange import Exchange
from gateway.relay.spans import request_attributes
from gateway.settings import Settings

BACKEND = BackendView("b1", "http://b1", "m", "eagle3", 3, "B200", 1)
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_PARENT = "00f067aa0ba902b7"


def settings(**fields: object) -> Settings:
    return Settings(admin_token="unit-admin-token-0123456789", **fields)


@pytest.fixture
def spans() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def tracing(spans: InMemorySpanExporter) -> Tracing:
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(spans))
    return Tracing(provider, frozenset({"/v1/chat/completions"}))


def test_the_backend_gets_our_span_as_its_parent_and_the_clients_tracestate(
    tracing: Tracing, spans: InMemorySpanExporter
) -> None:
    incoming = {
        b"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_PARENT}-01".encode(),
        b"tracestate": b"vendor=1",
    }
    x = Exchange("rid-1")
    x.span = tracing.start_request("/v1/chat/completions", incoming)
    upstream = {"traceparent": "00-from-the-client-01", "tracestate": "vendor=1", "x-a": "1"}
    tracing.inject(x.span, upstream)
    tracing.attempt_failed(x.span, BACKEND, UpstreamError("backend unreachable: ConnectError"))
    tracing.end_request(x.span, request_attributes(x), x.status, x.outcome)
    (server,) = spans.get_finished_spans()
    assert server.kind == SpanKind.SERVER
    assert server.context is not None
    assert server.parent is not None
    assert f"{server.context.trace_id:032x}" == CLIENT_TRACE
    assert f"{server.parent.span_id:016x}" == CLIENT_PARENT
    version, trace_id, parent, flags = upstream["traceparent"].split("-")
    assert (version, trace_id, parent) == ("00", CLIENT_TRACE, f"{server.context.span_id:016x}")
    assert int(flags, 16) & 1  # sampled, as the client asked
    assert upstream["tracestate"] == "vendor=1"
    assert upstream["x-a"] == "1"
    (event,) = server.events
    assert event.name == "draftgate.attempt_failed"
    assert dict(event.attributes or {}) == {
        "draftgate.backend": "b1",
        "error.type": "upstream_error",
        "exception.message": "backend unreachable: ConnectError",
    }


def test_an_unknown_path_names_no_span_after_itself(
    tracing: Tracing, spans: InMemorySpanExporter
) -> None:
    x = Exchange("rid-2")
    x.span = tracing.start_request("/v1/whatever-" + "x" * 50, {})
    tracing.end_request(x.span, request_attributes(x), x.status, x.outcome)
    (span,) = spans.get_finished_spans()
    assert span.name == "POST"
    assert span.parent is None


def test_request_attributes_carry_tokens_routing_and_outcome() -> None:
    x = Exchange("rid-3", model="m", backend=BACKEND, method="eagle3", status=200)
    x.usage = {"prompt_tokens": 11, "completion_tokens": 29}
    x.first_byte, x.chunks, x.attempts, x.fallback = x.started + 0.25, 30, 2, "unhealthy"
    found = request_attributes(x)
    assert found["gen_ai.usage.input_tokens"] == 11
    assert found["gen_ai.usage.output_tokens"] == 29
    assert found["gen_ai.request.model"] == "m"
    assert (found["draftgate.backend"], found["draftgate.method"], found["draftgate.k"]) == (
        "b1",
        "eagle3",
        3,
    )
    assert found["draftgate.ttft_ms"] == pytest.approx(250.0)
    assert (found["draftgate.attempts"], found["draftgate.fallback"]) == (2, "unhealthy")
    assert (found["draftgate.outcome"], found["http.response.status_code"]) == ("ok", 200)


def test_a_refused_request_has_no_tokens_or_backend() -> None:
    found = request_attributes(Exchange("rid-4", status=400, outcome="rejected"))
    assert not {"gen_ai.usage.input_tokens", "draftgate.backend", "draftgate.ttft_ms"} & set(found)


def test_export_headers_are_pairs_with_url_encoded_values() -> None:
    given = settings(otel_headers="Api-Key=abc%3D%3D, x-team = core ,no-value,=nameless")
    assert export_headers(given) == {"api-key": "abc==", "x-team": "core"}
    assert export_headers(settings()) == {}


def test_tracing_is_off_by_default_and_its_endpoint_must_be_a_url() -> None:
    assert settings().tracing is False
    assert start_tracing(settings()) is None
    with pytest.raises(ValidationError):
        settings(otel_endpoint="127.0.0.1:4318")
    with pytest.raises(ValidationError):
        settings(otel_sample_ratio=1.5)


def test_tracing_on_without_the_extra_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "gateway.events.tracing", None)  # as if its imports failed
    monkeypatch.delattr(gateway.events, "tracing", raising=False)
    with pytest.raises(RuntimeError, match=r"draftgate\[otel\]"):
        start_tracing(settings(tracing=True))
