"""Tracing end to end: the openai client → `draftgate gateway` (tracing on) → `draftgate sim`,
the gateway exporting to a real OTLP/HTTP receiver on loopback; and a gateway with tracing off.
"""

from __future__ import annotations

import gzip
import secrets
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from tests.e2e.conftest import (
    ADMIN_TOKEN,
    SIM_MODEL,
    ModuleGatewayStarter,
    ModuleServerStarter,
    Server,
    closed_url,
    fleet_backend,
    gateway_env,
    sim_args,
    spawn_server,
    write_fleet,
)

SLOW_MODEL = "slow/gpt-oss-20b"  # time scale 1: a stream long enough to leave mid-way
BROKEN_MODEL = "broken/gpt-oss-20b"  # its sim cuts every stream half-way
DOWN_MODEL = "down/gpt-oss-20b"  # its only backend listens nowhere
CHAT = [{"role": "user", "content": "Tell me about speculative decoding."}]
SPAN_TIMEOUT_S = 20.0  # a deadline: exports go out every 50 ms, a busy machine is slower
SERVER, INTERNAL = Span.SPAN_KIND_SERVER, Span.SPAN_KIND_INTERNAL
ERROR = Status.STATUS_CODE_ERROR


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as the collector received it (ids in hex)."""

    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: int
    status: int
    attributes: dict[str, Any]
    resource: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]


def _values(pairs: Any) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for pair in pairs:
        assert isinstance(pair, KeyValue)
        kind = pair.value.WhichOneof("value")
        found[pair.key] = getattr(pair.value, kind) if kind else None
    return found


class OtlpReceiver(ThreadingHTTPServer):
    """A minimal OTLP/HTTP collector: POST /v1/traces (protobuf) keeps every span."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _OtlpHandler)
        self.spans: list[ReceivedSpan] = []
        self.changed = threading.Condition()

    @property
    def endpoint(self) -> str:
        """Its traces URL."""
        return f"http://127.0.0.1:{self.server_address[1]}/v1/traces"

    def keep(self, request: ExportTraceServiceRequest) -> None:
        received = []
        for resource_spans in request.resource_spans:
            resource = _values(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received.append(
                        ReceivedSpan(
                            span.trace_id.hex(),
                            span.span_id.hex(),
                            span.parent_span_id.hex(),
                            span.name,
                            span.kind,
                            span.status.code,
                            _values(span.attributes),
                            resource,
                            [(e.name, _values(e.attributes)) for e in span.events],
                        )
                    )
        with self.changed:
            self.spans.extend(received)
            self.changed.notify_all()

    def of_trace(self, trace_id: str) -> list[ReceivedSpan]:
        """The spans of one trace received so far."""
        with self.changed:
            return [s for s in self.spans if s.trace_id == trace_id]

    def wait_for(
        self, match: Callable[[ReceivedSpan], bool], timeout_s: float = SPAN_TIMEOUT_S
    ) -> ReceivedSpan:
        """The first span received that `match`es, waiting for it until a deadline."""
        deadline = time.monotonic() + timeout_s
        with self.changed:
            while True:
                found = [s for s in self.spans if match(s)]
                if found:
                    return found[0]
                left = deadline - time.monotonic()
                if left <= 0:
                    names = sorted({s.name for s in self.spans})
                    pytest.fail(f"no such span within {timeout_s} s; received: {names}")
                self.changed.wait(left)


class _OtlpHandler(BaseHTTPRequestHandler):
    server: OtlpReceiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        if self.headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        if self.path != "/v1/traces":
            self.send_error(404)
            return
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        self.server.keep(request)
        answer = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet."""


@dataclass(frozen=True)
class TraceContext:
    """A client's W3C trace context: the trace and its own span's id."""

    trace_id: str
    span_id: str

    @classmethod
    def new(cls) -> TraceContext:
        return cls(secrets.token_hex(16), secrets.token_hex(8))

    def headers(self, request_id: str) -> dict[str, str]:
        """What the client sends: its sampled traceparent, a tracestate and a request id."""
        traceparent = f"00-{self.trace_id}-{self.span_id}-01"
        return {"traceparent": traceparent, "tracestate": "client=1", "x-request-id": request_id}


@dataclass
class Sims:
    """The module's simulated backends."""

    plain: Server
    slow: Server
    broken: Server


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    """The collector, served from a thread."""
    server = OtlpReceiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture(scope="module")
def sims(start_module_servers: ModuleServerStarter) -> Sims:
    plain, slow, broken = start_module_servers(
        sim_args("--method", "plain", "--time-scale", "50"),
        sim_args("--method", "plain", "--time-scale", "1", "--served-model-name", SLOW_MODEL),
        sim_args("--method", "plain", "--drop-rate", "1", "--served-model-name", BROKEN_MODEL),
    )
    return Sims(plain, slow, broken)


def fleet_of(sims: Sims) -> list[dict[str, object]]:
    return [
        fleet_backend("sim-plain", sims.plain.base_url),
        fleet_backend("sim-slow", sims.slow.base_url, model=SLOW_MODEL),
        fleet_backend("sim-broken", sims.broken.base_url, model=BROKEN_MODEL),
        fleet_backend("nowhere", closed_url(), model=DOWN_MODEL),
    ]


@pytest.fixture(scope="module")
def traced(
    start_module_gateway: ModuleGatewayStarter, sims: Sims, receiver: OtlpReceiver
) -> Server:
    """A gateway with tracing on, exporting to the receiver every 50 ms."""
    settings = {
        "TRACING": "true",
        "OTEL_ENDPOINT": receiver.endpoint,
        "OTEL_EXPORT_INTERVAL_S": "0.05",
        "OTEL_SERVICE_NAME": "gateway-under-test",
    }
    server, _ = start_module_gateway(fleet_of(sims), **settings)
    return server


def llm(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


def trace_context_seen(sim: Server, request_id: str) -> dict[str, str]:
    """The trace headers the backend received with the request of `request_id`."""
    seen = httpx.get(f"{sim.base_url}/sim/trace-context", timeout=5.0).json()
    found = [h for h in seen if h.get("x-request-id") == request_id]
    assert len(found) == 1, seen
    return dict(found[0])


def sampled_parent(traceparent: str) -> tuple[str, str]:
    """(trace id, parent span id) of a W3C `traceparent` whose sampled flag is set."""
    version, trace_id, span_id, flags = traceparent.split("-")
    assert version == "00"
    assert int(flags, 16) & 1, traceparent
    return trace_id, span_id


def span_of(receiver: OtlpReceiver, trace: TraceContext) -> ReceivedSpan:
    """The gateway's span of a relayed request, the one span of its trace."""
    span = receiver.wait_for(lambda s: s.trace_id == trace.trace_id)
    assert (span.kind, span.parent_span_id) == (SERVER, trace.span_id)
    assert len(receiver.of_trace(trace.trace_id)) == 1
    return span


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_relayed_request_continues_the_clients_trace_to_the_backend(
    traced: Server, sims: Sims, receiver: OtlpReceiver, stream: bool
) -> None:
    trace, rid = TraceContext.new(), f"traced-{uuid.uuid4().hex[:8]}"
    with llm(traced) as client:
        if stream:
            chunks = list(
                client.chat.completions.create(
                    model=SIM_MODEL,
                    messages=CHAT,
                    max_tokens=24,
                    stream=True,
                    stream_options={"include_usage": True},
                    extra_headers=trace.headers(rid),
                )
            )
            usage = chunks[-1].usage
        else:
            usage = client.chat.completions.create(
                model=SIM_MODEL, messages=CHAT, max_tokens=24, extra_headers=trace.headers(rid)
            ).usage
    assert usage is not None
    assert usage.completion_tokens > 0
    server = span_of(receiver, trace)
    assert server.name == "POST /v1/chat/completions"
    assert server.resource["service.name"] == "gateway-under-test"
    attributes = server.attributes
    assert attributes["gen_ai.request.model"] == SIM_MODEL
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.usage.input_tokens"] == usage.prompt_tokens
    assert attributes["gen_ai.usage.output_tokens"] == usage.completion_tokens
    assert attributes["draftgate.request_id"] == rid
    assert attributes["draftgate.backend"] == "sim-plain"
    assert attributes["draftgate.method"] == "plain"
    assert attributes["draftgate.outcome"] == "ok"
    assert attributes["http.response.status_code"] == 200
    assert attributes["draftgate.request_class"] == "interactive"
    assert attributes["draftgate.attempts"] == 1
    assert ("draftgate.ttft_ms" in attributes) is stream  # a whole response has no first token
    if stream:
        assert attributes["draftgate.ttft_ms"] > 0
    assert (server.status, server.events) == (Status.STATUS_CODE_UNSET, [])
    seen = trace_context_seen(sims.plain, rid)
    assert sampled_parent(seen["traceparent"]) == (trace.trace_id, server.span_id)
    assert seen["tracestate"] == "client=1"


def test_a_request_without_trace_context_starts_a_trace_the_backend_continues(
    traced: Server, sims: Sims, receiver: OtlpReceiver
) -> None:
    rid = f"untraced-{uuid.uuid4().hex[:8]}"
    with traced.client() as http:
        body = {"model": SIM_MODEL, "messages": CHAT, "max_tokens": 4}
        headers = {"x-request-id": rid}
        response = http.post("/v1/chat/completions", json=body, headers=headers)
    assert response.status_code == 200, response.text
    server = receiver.wait_for(
        lambda s: s.kind == SERVER and s.attributes.get("draftgate.request_id") == rid
    )
    assert server.parent_span_id == ""  # a root: the gateway started the trace
    seen = trace_context_seen(sims.plain, rid)
    assert sampled_parent(seen["traceparent"]) == (server.trace_id, server.span_id)
    assert "tracestate" not in seen


def test_a_client_that_leaves_mid_stream_ends_the_span(
    traced: Server, receiver: OtlpReceiver
) -> None:
    trace, rid = TraceContext.new(), f"gone-{uuid.uuid4().hex[:8]}"
    with llm(traced) as client:
        stream = client.chat.completions.create(
            model=SLOW_MODEL,
            messages=CHAT,
            max_tokens=2000,
            stream=True,
            extra_body={"ignore_eos": True},
            extra_headers=trace.headers(rid),
        )
        for received, _ in enumerate(stream):
            if received == 5:
                break
        stream.close()
    attributes = span_of(receiver, trace).attributes
    assert (attributes["draftgate.outcome"], attributes["http.response.status_code"]) == (
        "client_disconnect",
        499,
    )
    assert attributes["gen_ai.usage.output_tokens"] > 0  # read from the stream before it ended
    assert "error.type" not in attributes  # the client's choice, not the gateway's failure


def test_a_stream_the_backend_breaks_is_an_error_span(
    traced: Server, receiver: OtlpReceiver
) -> None:
    trace, rid = TraceContext.new(), f"broken-{uuid.uuid4().hex[:8]}"
    with traced.client() as http:
        body = {"model": BROKEN_MODEL, "messages": CHAT, "max_tokens": 40, "stream": True}
        response = http.post("/v1/chat/completions", json=body, headers=trace.headers(rid))
    assert response.status_code == 200  # the stream had begun: it ends with an error event
    assert "stream_interrupted" in response.text
    server = span_of(receiver, trace)
    assert (server.attributes["error.type"], server.status) == ("upstream_error", ERROR)
    assert server.attributes["http.response.status_code"] == 502
    assert server.events == []  # it broke after it began: not a failed attempt


def test_a_backend_that_is_down_is_a_failed_attempt_on_an_error_span(
    traced: Server, receiver: OtlpReceiver
) -> None:
    trace, rid = TraceContext.new(), f"down-{uuid.uuid4().hex[:8]}"
    with traced.client() as http:
        body = {"model": DOWN_MODEL, "messages": CHAT, "max_tokens": 4}
        response = http.post("/v1/chat/completions", json=body, headers=trace.headers(rid))
    assert response.status_code >= 500, response.text
    server = span_of(receiver, trace)
    assert (server.status, server.attributes["http.response.status_code"]) == (
        ERROR,
        response.status_code,
    )
    assert server.attributes["draftgate.attempts"] == 1
    ((name, attributes),) = server.events
    assert name == "draftgate.attempt_failed"
    assert (attributes["draftgate.backend"], attributes["error.type"]) == (
        "nowhere",
        "upstream_error",
    )
    assert attributes["exception.message"].startswith("backend unreachable")


def admin_change(
    traced: Server, method: str, path: str, trace: TraceContext, body: object = None
) -> httpx.Response:
    with traced.client(ADMIN_TOKEN) as http:
        headers = trace.headers(f"admin-{uuid.uuid4().hex[:8]}")
        response = http.request(method, path, json=body, headers=headers)
    assert response.status_code < 300, response.text
    return response


def audit_span(receiver: OtlpReceiver, trace: TraceContext, name: str) -> ReceivedSpan:
    """The request span of an admin change and its audit span called `name`; the latter."""
    request = receiver.wait_for(lambda s: s.trace_id == trace.trace_id and s.kind == SERVER)
    assert request.parent_span_id == trace.span_id
    audit = receiver.wait_for(lambda s: s.trace_id == trace.trace_id and s.name == name)
    assert (audit.kind, audit.parent_span_id) == (INTERNAL, request.span_id)
    assert audit.attributes["draftgate.audit.actor"] == "admin-api"
    return audit


def test_a_policy_change_is_a_span_with_its_audit_entry_and_a_read_is_none(
    traced: Server, receiver: OtlpReceiver
) -> None:
    read, change = TraceContext.new(), TraceContext.new()
    with traced.client(ADMIN_TOKEN) as http:
        assert http.get("/admin/v1/backends", headers=read.headers("r")).status_code == 200
    path = f"/admin/v1/models/{SIM_MODEL}/policy"
    admin_change(traced, "PUT", path, change, {"mode": "pinned", "method": "plain"})
    request = receiver.wait_for(lambda s: s.trace_id == change.trace_id and s.kind == SERVER)
    assert request.name == "PUT /admin/v1/models/{name:path}/policy"
    assert request.attributes["http.response.status_code"] == 200
    audit = audit_span(receiver, change, "audit update model")
    assert audit.attributes["draftgate.audit.resource_id"] == SIM_MODEL
    # Spans leave in the order they end: the read's would have come before the change's.
    assert receiver.of_trace(read.trace_id) == []


def test_backend_and_key_changes_are_spans(traced: Server, receiver: OtlpReceiver) -> None:
    traces = [TraceContext.new() for _ in range(4)]
    backend = {
        "name": "traced-extra",
        "url": closed_url(),
        "model": "traced/extra",
        "method": "plain",
        "gpu_type": "B200",
    }
    admin_change(traced, "POST", "/admin/v1/backends", traces[0], backend)
    admin_change(traced, "DELETE", "/admin/v1/backends/traced-extra", traces[1])
    key = admin_change(traced, "POST", "/admin/v1/keys", traces[2], {"name": "traced"}).json()
    admin_change(traced, "DELETE", f"/admin/v1/keys/{key['id']}", traces[3])
    names = [
        "audit create backend",
        "audit delete backend",
        "audit create api_key",
        "audit revoke api_key",
    ]
    for trace, name in zip(traces, names, strict=True):
        audit = audit_span(receiver, trace, name)
        wanted = "traced-extra" if "backend" in name else str(key["id"])
        assert audit.attributes["draftgate.audit.resource_id"] == wanted


def test_with_tracing_off_no_trace_context_is_invented_and_no_sdk_is_loaded(
    sims: Sims, tmp_path: Path
) -> None:
    fleet = write_fleet(tmp_path / "fleet.yaml", [fleet_backend("sim-plain", sims.plain.base_url)])
    env = gateway_env(f"sqlite:///{tmp_path}/draftgate.db", fleet)
    env["PYTHONPROFILEIMPORTTIME"] = "1"  # every import the process makes, on its stderr
    gateway = spawn_server(("gateway",), env, tmp_path)
    try:
        gateway.wait_healthy()
        trace, ids = TraceContext.new(), [f"off-{i}-{uuid.uuid4().hex[:8]}" for i in range(3)]
        with gateway.client() as http:
            for rid, stream in zip(ids[:2], (False, True), strict=True):
                body = {"model": SIM_MODEL, "messages": CHAT, "max_tokens": 4, "stream": stream}
                response = http.post(
                    "/v1/chat/completions", json=body, headers={"x-request-id": rid}
                )
                assert response.status_code == 200, response.text
            body = {"model": SIM_MODEL, "messages": CHAT, "max_tokens": 4}
            response = http.post("/v1/chat/completions", json=body, headers=trace.headers(ids[2]))
            assert response.status_code == 200, response.text
        assert "traceparent" not in trace_context_seen(sims.plain, ids[0])
        assert "traceparent" not in trace_context_seen(sims.plain, ids[1])
        forwarded = trace_context_seen(sims.plain, ids[2])  # passed on as it came
        assert forwarded["traceparent"] == trace.headers(ids[2])["traceparent"]
        assert forwarded["tracestate"] == "client=1"
    finally:
        gateway.close()
    imported = gateway.output()
    assert "gateway.relay.proxy" in imported  # the import log is there to read
    assert "gateway.events.tracing" not in imported
    assert "opentelemetry.sdk" not in imported
    assert "opentelemetry.exporter" not in imported


def test_a_collector_that_is_down_loses_spans_not_requests_nor_the_stop(
    sims: Sims, tmp_path: Path
) -> None:
    fleet = write_fleet(tmp_path / "fleet.yaml", [fleet_backend("sim-plain", sims.plain.base_url)])
    settings = {
        "TRACING": "true",
        "OTEL_ENDPOINT": f"{closed_url()}/v1/traces",
        "OTEL_EXPORT_INTERVAL_S": "0.05",
        "OTEL_EXPORT_TIMEOUT_S": "1",
    }
    env = gateway_env(f"sqlite:///{tmp_path}/draftgate.db", fleet, **settings)
    gateway = spawn_server(("gateway",), env, tmp_path)
    try:
        gateway.wait_healthy()
        with gateway.client() as http:
            for stream in (False, True, False):
                body = {"model": SIM_MODEL, "messages": CHAT, "max_tokens": 4, "stream": stream}
                response = http.post("/v1/chat/completions", json=body)
                assert response.status_code == 200, response.text
        started = time.monotonic()
        assert gateway.stop(signal.SIGTERM) == 0, gateway.output()
        assert time.monotonic() - started < 8.0, gateway.output()  # not the SDK's 30 s
    finally:
        gateway.close()


def test_a_caller_without_a_key_cannot_choose_to_be_sampled(
    sims: Sims, receiver: OtlpReceiver, tmp_path: Path
) -> None:
    """A sampled `traceparent` makes the gateway trace a request whatever its sample ratio
    (parent-based sampling): only a caller with a key may ask that. Before, one without a key
    was traced (and exported) at a ratio of 0."""
    fleet = write_fleet(tmp_path / "fleet.yaml", [fleet_backend("sim-plain", sims.plain.base_url)])
    settings = {
        "TRACING": "true",
        "OTEL_ENDPOINT": receiver.endpoint,
        "OTEL_EXPORT_INTERVAL_S": "0.05",
        "OTEL_SAMPLE_RATIO": "0",
        "REQUIRE_API_KEY": "true",
        "REGISTRY_REFRESH_S": "0.2",
    }
    env = gateway_env(f"sqlite:///{tmp_path}/draftgate.db", fleet, **settings)
    gateway = spawn_server(("gateway",), env, tmp_path)
    try:
        gateway.wait_healthy()
        with gateway.client(ADMIN_TOKEN) as admin:
            key = admin.post("/admin/v1/keys", json={"name": "traced"}).json()["key"]
        body = {"model": SIM_MODEL, "messages": CHAT, "max_tokens": 2}
        unkeyed, keyed = TraceContext.new(), TraceContext.new()
        with gateway.client() as http:
            refused = http.post("/v1/chat/completions", json=body, headers=unkeyed.headers("u1"))
            assert refused.status_code == 401
            deadline = time.monotonic() + 30  # until the registry knows the new key
            headers = {**keyed.headers("k1"), "authorization": f"Bearer {key}"}
            post = lambda: http.post("/v1/chat/completions", json=body, headers=headers)  # noqa: E731
            while (served := post()).status_code == 401:
                assert time.monotonic() < deadline, "the new key never worked"
                time.sleep(0.1)
            assert served.status_code == 200, served.text
        span_of(receiver, keyed)  # the keyed caller's trace is continued, at a ratio of 0
        assert receiver.of_trace(unkeyed.trace_id) == []  # ended first, exported no later
    finally:
        gateway.close()
