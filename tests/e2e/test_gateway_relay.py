"""The relay end to end: the openai client → `draftgate gateway` → `draftgate sim` processes."""

from __future__ import annotations

import gzip
import http.client
import itertools
import json
import re
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import openai
import pytest

from tests.e2e.conftest import (
    ADMIN_TOKEN,
    SIM_MODEL,
    ModuleGatewayStarter,
    ModuleServerStarter,
    Server,
    ServerStarter,
    fleet_backend,
    gateway_env,
    metric_value,
    query_rows,
    sim_args,
    wait_for_metric,
    wait_for_usage_records,
    write_fleet,
)

GAP_S = 0.001  # a pause between two chunks that a relay passing them through keeps
SLOW_MODEL = "slow/gpt-oss-20b"  # a time-scale-1 sim of its own: timing and disconnects
ECHO_MODEL = "echo/headers"  # a stub backend that records the headers it receives
GENERATED_ID = re.compile(r"^[0-9a-f]{32}$")
CHAT = [{"role": "user", "content": "Tell me about speculative decoding."}]
POLICY_PATH = f"/admin/v1/models/{SIM_MODEL}/policy"
# Deadlines of polls, generous for a busy machine: a pinned policy applies at the next
# registry refresh, an abort reaches the backend once the gateway notices the disconnect.
PIN_TIMEOUT_S = 15.0
ABORT_TIMEOUT_S = 15.0


@dataclass
class Sims:
    """The module's simulated backends."""

    plain: Server
    peagle: Server
    slow: Server

    def generated_tokens(self) -> float:
        """Completion tokens the fast sims produced so far, together."""
        name = "vllm:generation_tokens_total"
        return sum(metric_value(s.base_url, name) for s in (self.plain, self.peagle))


class EchoBackend(ThreadingHTTPServer):
    """A stub OpenAI backend that answers every chat and keeps the headers it was sent."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _EchoHandler)
        self.seen: list[dict[str, str]] = []

    @property
    def url(self) -> str:
        """Its base URL."""
        return f"http://127.0.0.1:{self.server_address[1]}"


class _EchoHandler(BaseHTTPRequestHandler):
    server: EchoBackend

    def do_GET(self) -> None:
        self._answer(b"")

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))))
        self.server.seen.append({k.lower(): v for k, v in self.headers.items()})
        if request.get("stream"):
            self._gzipped_stream()
            return
        message = {"role": "assistant", "content": "echo"}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        body = {"id": "echo", "object": "chat.completion", "created": 0, "model": ECHO_MODEL}
        self._answer(json.dumps(body | {"choices": [choice], "usage": usage}).encode())

    def _gzipped_stream(self) -> None:
        """A stream compressed whatever the client asked for, as a compressing hop in front
        of vLLM may send it."""
        head = {"id": "echo", "object": "chat.completion.chunk", "created": 0, "model": ECHO_MODEL}
        delta = {"index": 0, "delta": {"content": "echo"}, "finish_reason": None}
        usage = {"prompt_tokens": 1, "completion_tokens": 7, "total_tokens": 8}
        events = [head | {"choices": [delta]}, head | {"choices": [], "usage": usage}]
        compact = (json.dumps(e, separators=(",", ":")) for e in events)  # as vLLM writes
        text = "".join(f"data: {e}\n\n" for e in compact) + "data: [DONE]\n\n"
        body = gzip.compress(text.encode())
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("content-encoding", "gzip")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _answer(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet."""


@pytest.fixture(scope="module")
def sims(start_module_servers: ModuleServerStarter) -> Sims:
    """A plain and a p-eagle sim of the model (fast), and a slow one of SLOW_MODEL."""
    plain, peagle, slow = start_module_servers(
        sim_args("--method", "plain", "--time-scale", "50"),
        sim_args("--method", "p-eagle", "--k", "7", "--time-scale", "50"),
        sim_args("--method", "plain", "--time-scale", "1", "--served-model-name", SLOW_MODEL),
    )
    return Sims(plain, peagle, slow)


@pytest.fixture(scope="module")
def echo() -> Iterator[EchoBackend]:
    """The header-recording stub, served from a thread."""
    server = EchoBackend()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def fleet_of(sims: Sims, echo: EchoBackend) -> list[dict[str, object]]:
    """The fleet: both fast sims as backends of SIM_MODEL, plus the slow and echo models."""
    return [
        fleet_backend("sim-plain", sims.plain.base_url),
        fleet_backend("sim-peagle", sims.peagle.base_url, "p-eagle"),
        fleet_backend("sim-slow", sims.slow.base_url, model=SLOW_MODEL),
        fleet_backend("echo", echo.url, model=ECHO_MODEL),
    ]


@pytest.fixture(scope="module")
def gateway(start_module_gateway: ModuleGatewayStarter, sims: Sims, echo: EchoBackend) -> Server:
    """One gateway for the tests that do not read the ledger."""
    server, _ = start_module_gateway(fleet_of(sims, echo))
    return server


@pytest.fixture
def ledger_gateway(
    start_server: ServerStarter, database_url: str, tmp_path: Path, sims: Sims, echo: EchoBackend
) -> tuple[Server, str]:
    """A gateway of its own on a fresh database (SQLite and PostgreSQL); (server, db URL)."""
    fleet = write_fleet(tmp_path / "fleet.yaml", fleet_of(sims, echo))
    return start_server("gateway", env=gateway_env(database_url, fleet)), database_url


def llm(server: Server) -> openai.OpenAI:
    """The official client pointed at a gateway (no client-side retries)."""
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


def test_lists_the_fleets_models(gateway: Server) -> None:
    with llm(gateway) as client:
        models = client.models.list()
    assert sorted(m.id for m in models.data) == sorted([SIM_MODEL, SLOW_MODEL, ECHO_MODEL])
    assert all(m.owned_by == "draftgate" for m in models.data)


def test_completes_and_chats_through_a_fleet_backend(gateway: Server) -> None:
    with llm(gateway) as client:
        raw = client.completions.with_raw_response.create(
            model=SIM_MODEL,
            prompt="Once upon a time",
            max_tokens=12,
            extra_body={"ignore_eos": True},
        )
        completion = raw.parse()
        assert completion.choices[0].text
        assert completion.usage is not None
        assert completion.usage.completion_tokens == 12
        raw_chat = client.chat.completions.with_raw_response.create(
            model=SIM_MODEL, messages=CHAT, max_tokens=9, extra_body={"ignore_eos": True}
        )
        chat = raw_chat.parse()
    assert chat.choices[0].message.content
    assert chat.usage is not None
    assert chat.usage.completion_tokens == 9
    assert chat.usage.prompt_tokens > 0
    methods = {"sim-plain": "plain", "sim-peagle": "p-eagle"}
    for headers in (raw.headers, raw_chat.headers):
        assert methods[headers["x-draftgate-backend"]] == headers["x-draftgate-method"]
        assert GENERATED_ID.match(headers["x-request-id"])


def test_streams_chat_with_the_usage_chunk_when_asked(gateway: Server, sims: Sims) -> None:
    before = sims.generated_tokens()
    with llm(gateway) as client:
        stream = client.chat.completions.create(
            model=SIM_MODEL,
            messages=CHAT,
            max_tokens=40,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        chunks = list(stream)
    *content, last = chunks
    assert last.choices == []
    assert last.usage is not None
    assert last.usage.completion_tokens == 40
    assert all(c.choices for c in content)
    assert "".join(c.choices[0].delta.content or "" for c in content)
    assert sims.generated_tokens() - before == last.usage.completion_tokens


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_streams_without_the_usage_chunk_when_not_asked(gateway: Server, endpoint: str) -> None:
    with llm(gateway) as client:
        if endpoint == "chat":
            chunks: list[openai.BaseModel] = list(
                client.chat.completions.create(
                    model=SIM_MODEL, messages=CHAT, max_tokens=30, stream=True
                )
            )
        else:
            chunks = list(
                client.completions.create(
                    model=SIM_MODEL, prompt="Once", max_tokens=30, stream=True
                )
            )
    assert len(chunks) > 1
    assert all(c.choices and c.choices[0] is not None for c in chunks)  # type: ignore[attr-defined]


def test_request_id_is_echoed_and_forwarded_or_replaced(gateway: Server, echo: EchoBackend) -> None:
    body = {"model": ECHO_MODEL, "messages": CHAT}
    with gateway.client() as http:
        for sent in ("client-id_1.2:3", "has spaces", "x" * 200, None):
            headers = {} if sent is None else {"x-request-id": sent}
            response = http.post("/v1/chat/completions", json=body, headers=headers)
            assert response.status_code == 200, response.text
            assert response.headers["x-draftgate-backend"] == "echo"
            rid = response.headers["x-request-id"]
            if sent == "client-id_1.2:3":
                assert rid == sent
            else:
                assert GENERATED_ID.match(rid), rid
            assert echo.seen[-1]["x-request-id"] == rid


def test_only_trace_context_goes_upstream_and_encoding_is_identity(
    gateway: Server, echo: EchoBackend
) -> None:
    body = {"model": ECHO_MODEL, "messages": CHAT}
    sent = {
        "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "tracestate": "vendor=1",
        "authorization": "Bearer sk-the-clients-own",
        "cookie": "session=1",
        "x-custom": "kept out",
        "accept-encoding": "gzip",
    }
    with gateway.client() as http:
        response = http.post("/v1/chat/completions", json=body, headers=sent)
    assert response.status_code == 200, response.text
    seen = echo.seen[-1]
    assert {k: seen.get(k) for k in ("traceparent", "tracestate")} == {
        "traceparent": sent["traceparent"],
        "tracestate": sent["tracestate"],
    }
    assert not {"authorization", "cookie", "x-custom"} & set(seen)
    assert seen["accept-encoding"] == "identity"


def test_a_compressed_stream_is_decoded_before_its_usage_is_read(gateway: Server) -> None:
    body = {"model": ECHO_MODEL, "messages": CHAT, "stream": True}
    counted = "draftgate_tokens_total"
    before = metric_value(gateway.base_url, counted, model=ECHO_MODEL, kind="completion")
    with gateway.client() as http:
        response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    assert "content-encoding" not in response.headers
    assert response.text.startswith("data: {")
    assert response.text.endswith("data: [DONE]\n\n")
    assert '"usage"' not in response.text  # not asked for: stripped, yet read and counted
    labels = {"model": ECHO_MODEL, "kind": "completion"}
    wait_for_metric(gateway.base_url, counted, before + 7, timeout_s=30, **labels)


def served_by(client: openai.OpenAI) -> str:
    """The backend that served one short chat."""
    raw = client.chat.completions.with_raw_response.create(
        model=SIM_MODEL, messages=CHAT, max_tokens=2
    )
    return raw.headers["x-draftgate-backend"]


def wait_until_served_by(client: openai.OpenAI, backend: str) -> None:
    """Within PIN_TIMEOUT_S every request goes to `backend`."""
    deadline = time.monotonic() + PIN_TIMEOUT_S
    while served_by(client) != backend:
        if time.monotonic() > deadline:
            pytest.fail(f"not served by {backend} within {PIN_TIMEOUT_S} s of pinning")
        time.sleep(0.05)
    assert {served_by(client) for _ in range(8)} == {backend}


def test_pinning_a_method_moves_the_traffic(gateway: Server) -> None:
    # at once: the gradual steps of a move are tests/e2e/test_moves.py's
    at_once = {"immediate": "true"}
    with gateway.client(ADMIN_TOKEN) as admin, llm(gateway) as client:
        try:
            pin = {"mode": "pinned", "method": "p-eagle", "k": 7}
            pinned = admin.put(POLICY_PATH, json=pin, params=at_once)
            assert pinned.status_code == 200, pinned.text
            wait_until_served_by(client, "sim-peagle")
            pin = {"mode": "pinned", "method": "plain"}
            pinned = admin.put(POLICY_PATH, json=pin, params=at_once)
            assert pinned.status_code == 200, pinned.text
            wait_until_served_by(client, "sim-plain")
        finally:
            assert admin.put(POLICY_PATH, json={"mode": "auto"}).status_code == 200


def test_streaming_passes_chunks_through_without_buffering(gateway: Server) -> None:
    with llm(gateway) as client:
        started = time.perf_counter()
        stream = client.chat.completions.create(
            model=SLOW_MODEL,
            messages=CHAT,
            max_tokens=200,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        arrivals = [time.perf_counter() - started for chunk in stream if chunk.choices]
    content = arrivals[1:]  # after the role chunk
    assert content[-1] - content[0] > 0.3, "the slow sim must take a while to mean anything"
    # Passed through, the chunks arrive as the simulator makes them (about 5 ms apart); a
    # buffering relay would hand them over in a few bursts. Judged by the gaps between them,
    # not by when the first one came: on a busy machine the simulator itself can start late
    # and catch up (the first content chunk came at 0.51 s of 0.92 s once, under two
    # concurrent test runs), which says nothing about the relay.
    gaps = sum(1 for a, b in itertools.pairwise(content) if b - a > GAP_S)
    print(f"\n{gaps} gaps over {GAP_S * 1000:g} ms between {len(content)} content chunks")
    assert gaps >= len(content) // 4, (gaps, len(content))


def test_gateway_metrics_count_requests_and_tokens(gateway: Server) -> None:
    with llm(gateway) as client:
        served = served_by(client)
    method = {"sim-plain": "plain", "sim-peagle": "p-eagle"}[served]
    labels = {"model": SIM_MODEL, "method": method}
    assert metric_value(gateway.base_url, "draftgate_requests_total", **labels, status="2xx") >= 1
    for kind in ("prompt", "completion"):
        assert metric_value(gateway.base_url, "draftgate_tokens_total", **labels, kind=kind) >= 1


def test_ready_with_healthy_backends(gateway: Server) -> None:
    with gateway.client() as http:
        response = http.get("/ready")
    assert response.status_code == 200, response.text
    assert response.json()["backends_healthy"] == 4


def mixed_request(client: openai.OpenAI, i: int, rid: str) -> tuple[int, int]:
    """Request number `i` of a mix (chat or completion, stream or not); its usage."""
    extra = {"extra_headers": {"x-request-id": rid}, "max_tokens": 5 + i}
    extra["extra_body"] = {"ignore_eos": True} if i % 3 else {}
    usage: openai.types.CompletionUsage | None
    if i % 4 == 0:
        usage = client.chat.completions.create(model=SIM_MODEL, messages=CHAT, **extra).usage
    elif i % 4 == 1:
        usage = client.completions.create(model=SIM_MODEL, prompt=f"Number {i}", **extra).usage
    else:
        options = {"stream": True, "stream_options": {"include_usage": True}}
        if i % 4 == 2:
            chunks: list[openai.BaseModel] = list(
                client.chat.completions.create(model=SIM_MODEL, messages=CHAT, **options, **extra)
            )
        else:
            chunks = list(
                client.completions.create(model=SIM_MODEL, prompt="x", **options, **extra)
            )
        usage = chunks[-1].usage  # type: ignore[attr-defined]
    assert usage is not None
    return usage.prompt_tokens, usage.completion_tokens


def test_usage_in_the_ledger_equals_what_the_client_saw(
    ledger_gateway: tuple[Server, str],
) -> None:
    server, database_url = ledger_gateway
    count, seen = 20, {}
    with llm(server) as client:
        for i in range(count):
            rid = f"exact-{uuid.uuid4().hex[:8]}-{i}"
            seen[rid] = mixed_request(client, i, rid)
    records = wait_for_usage_records(database_url, seen)
    assert len(query_rows(database_url, "SELECT id FROM usage_records")) == count
    for rid, (prompt, completion) in seen.items():
        record = records[rid]
        assert (record["prompt_tokens"], record["completion_tokens"]) == (prompt, completion)
        assert (record["status_code"], record["outcome"]) == (200, "ok")
    prompt_total = sum(p for p, _ in seen.values())
    completion_total = sum(c for _, c in seen.values())
    hourly = query_rows(
        database_url,
        "SELECT SUM(requests) AS n, SUM(prompt_tokens) AS p, SUM(completion_tokens) AS c "
        "FROM usage_hourly",
    )
    assert (hourly[0]["n"], hourly[0]["p"], hourly[0]["c"]) == (
        count,
        prompt_total,
        completion_total,
    )


def test_client_disconnect_aborts_the_upstream_and_is_recorded(
    ledger_gateway: tuple[Server, str], sims: Sims
) -> None:
    server, database_url = ledger_gateway
    rid = f"gone-{uuid.uuid4().hex[:8]}"
    with llm(server) as client:
        stream = client.chat.completions.create(
            model=SLOW_MODEL,
            messages=CHAT,
            max_tokens=2000,
            stream=True,
            extra_body={"ignore_eos": True},
            extra_headers={"x-request-id": rid},
        )
        for received, _ in enumerate(stream):
            if received == 5:
                break
        assert metric_value(sims.slow.base_url, "vllm:num_requests_running") == 1
        stream.close()
    wait_for_metric(sims.slow.base_url, "vllm:num_requests_running", 0, ABORT_TIMEOUT_S)
    record = wait_for_usage_records(database_url, [rid])[rid]
    assert (record["outcome"], record["status_code"]) == ("client_disconnect", 499)
    assert record["completion_tokens"] > 0
    assert record["backend_name"] == "sim-slow"
    with httpx.Client(base_url=server.base_url) as http:
        assert http.get("/ready").status_code == 200


def test_a_long_client_request_id_does_not_stall_the_ledger(
    ledger_gateway: tuple[Server, str],
) -> None:
    server, database_url = ledger_gateway
    body = {"model": SIM_MODEL, "messages": CHAT, "max_tokens": 2}
    with server.client() as http:
        long_id = http.post("/v1/chat/completions", json=body, headers={"x-request-id": "r" * 100})
        assert long_id.status_code == 200, long_id.text
        later = f"after-{uuid.uuid4().hex[:8]}"
        response = http.post("/v1/chat/completions", json=body, headers={"x-request-id": later})
        assert response.status_code == 200, response.text
    records = wait_for_usage_records(database_url, [long_id.headers["x-request-id"], later])
    assert all(r["outcome"] == "ok" for r in records.values())


def test_a_reused_client_request_id_still_records_every_request(
    ledger_gateway: tuple[Server, str],
) -> None:
    server, database_url = ledger_gateway
    body = {"model": SIM_MODEL, "messages": CHAT, "max_tokens": 3, "ignore_eos": True}
    rid = f"reused-{uuid.uuid4().hex[:8]}"
    with server.client() as http:
        for _ in range(3):
            response = http.post("/v1/chat/completions", json=body, headers={"x-request-id": rid})
            assert response.status_code == 200, response.text
        marker = f"marker-{uuid.uuid4().hex[:8]}"
        http.post("/v1/chat/completions", json=body, headers={"x-request-id": marker})
    wait_for_usage_records(database_url, [marker])  # written after the three
    rows = query_rows(database_url, "SELECT completion_tokens FROM usage_records")
    assert [r["completion_tokens"] for r in rows] == [3, 3, 3, 3], "every request is billed"


def test_a_long_unknown_model_name_does_not_stall_the_ledger(
    ledger_gateway: tuple[Server, str],
) -> None:
    server, database_url = ledger_gateway
    with server.client() as http:
        unknown = http.post("/v1/chat/completions", json={"model": "m" * 300, "messages": CHAT})
        assert unknown.status_code == 404, unknown.text
        assert unknown.json()["error"]["code"] == "model_not_found"
        rid = f"after-{uuid.uuid4().hex[:8]}"
        body = {"model": SIM_MODEL, "messages": CHAT, "max_tokens": 2}
        response = http.post("/v1/chat/completions", json=body, headers={"x-request-id": rid})
        assert response.status_code == 200, response.text
    assert wait_for_usage_records(database_url, [rid])[rid]["outcome"] == "ok"


def test_an_idle_client_connection_outlives_the_clients_pool_expiry(gateway: Server) -> None:
    """httpx and the openai SDK keep an idle connection 5 s, as uvicorn did by default: a
    request sent on one as the server closed it was reset (two of 9000 requests once). The
    gateway keeps idle connections `keep_alive_s` (75 s), so the client always drops first."""
    host, port = gateway.base_url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("GET", "/health")
        first = conn.getresponse()
        assert first.status == 200, first.read()
        first.read()
        sock = conn.sock  # http.client reconnects only when it has no socket
        time.sleep(6.0)  # idle past the 5 s both sides used to share
        conn.request("GET", "/health")
        second = conn.getresponse()  # RemoteDisconnected had the server closed it
        assert second.status == 200, second.read()
        assert conn.sock is sock, "the second request went out on the same connection"
    finally:
        conn.close()
