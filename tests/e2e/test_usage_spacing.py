r"""A backend that writes its stream's JSON with spaces (`"usage": {`, `"choices": []`, events
pretty-printed over several `data:` lines, each written in small pieces) behind the real
gateway: the ledger holds its exact usage, and a client sees only the usage it asked for.
Another writes the same with its lines ending in `\r\n`, as sse-starlette does: each event
reaches the client as soon as it is whole."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import (
    ADMIN_TOKEN,
    SIM_MODEL,
    ModuleGatewayStarter,
    Server,
    fleet_backend,
)

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
WORDS = [" Drafts", " are", " checked", " in", " one", " pass."]
PROMPT_TOKENS = 11
PIECE_BYTES = 7  # each event goes out in pieces this long, so the gateway reads it cut
LEDGER_WAIT_S = 30.0  # a deadline, not a wait
FIRST_EVENT_WAIT_S = 10.0  # a deadline, not a wait: the held last event goes out when it passes
CRLF_MODEL = "Qwen/Qwen3-8B"  # the `\r\n` backend's, so requests pick their backend by model


class SpacedBackend(ThreadingHTTPServer):
    """A chat backend on loopback whose streams are JSON as `json.dumps` writes it by
    default, each line ending in `line_end`; it keeps the `stream_options` each request asked
    of it. With `hold_last`, a stream's last event waits until its client has set
    `first_seen` (or FIRST_EVENT_WAIT_S has passed); `held` says which it was, by stream."""

    daemon_threads = True

    def __init__(
        self, model: str = SIM_MODEL, line_end: bytes = b"\n", hold_last: bool = False
    ) -> None:
        super().__init__(("127.0.0.1", 0), _SpacedHandler)
        self.model, self.line_end, self.hold_last = model, line_end, hold_last
        self.asked: list[dict[str, Any]] = []
        self.first_seen = threading.Event()  # the client holds the stream's first event
        self.held: list[bool] = []  # by stream: its last event waited for `first_seen`

    @property
    def url(self) -> str:
        """Its base URL."""
        return f"http://127.0.0.1:{self.server_address[1]}"


def _usage(completion_tokens: int) -> dict[str, int]:
    total = PROMPT_TOKENS + completion_tokens
    return {
        "prompt_tokens": PROMPT_TOKENS,
        "completion_tokens": completion_tokens,
        "total_tokens": total,
    }


def _spaced(body: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(body)}\n\n".encode()


def _pretty(body: dict[str, Any]) -> bytes:
    lines = json.dumps(body, indent=2).splitlines()
    return "".join(f"data: {line}\n" for line in lines).encode() + b"\n"


def spaced_stream(
    include_usage: bool, continuous: bool, model: str = SIM_MODEL, line_end: bytes = b"\n"
) -> list[bytes]:
    """The stream's events: a chunk per word (every other one pretty-printed), cumulative
    usage on each when `continuous`, the usage-only chunk when `include_usage`, then `[DONE]`,
    each line ending in `line_end`."""
    head = {
        "id": "chatcmpl-spaced",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": model,
    }
    events = []
    for n, word in enumerate(WORDS, 1):
        choice = {"index": 0, "delta": {"content": word}, "finish_reason": None}
        body = head | {"choices": [choice]} | ({"usage": _usage(n)} if continuous else {})
        events.append((_pretty if n % 2 else _spaced)(body))
    if include_usage:
        events.append(_spaced(head | {"choices": [], "usage": _usage(len(WORDS))}))
    return [e.replace(b"\n", line_end) for e in [*events, b"data: [DONE]\n\n"]]


class _SpacedHandler(BaseHTTPRequestHandler):
    server: SpacedBackend

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._answer(200, {"object": "list", "data": [{"id": self.server.model}]})
        elif self.path == "/health":
            self._answer(200, None)
        else:
            self._answer(404, {"error": {"message": "not found"}})

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))))
        options = request.get("stream_options") or {}
        self.server.asked.append(options)
        stream = spaced_stream(
            options.get("include_usage") is True,
            options.get("continuous_usage_stats") is True,
            self.server.model,
            self.server.line_end,
        )
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()  # HTTP/1.0: the body ends when the connection closes
        *events, last = stream
        self._write_in_pieces(b"".join(events))
        if self.server.hold_last:
            self.server.held.append(self.server.first_seen.wait(FIRST_EVENT_WAIT_S))
        self._write_in_pieces(last)

    def _write_in_pieces(self, data: bytes) -> None:
        for at in range(0, len(data), PIECE_BYTES):
            self.wfile.write(data[at : at + PIECE_BYTES])
            time.sleep(0.0005)

    def _answer(self, status: int, body: object) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet."""


@contextmanager
def serving(server: SpacedBackend) -> Iterator[SpacedBackend]:
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def backend() -> Iterator[SpacedBackend]:
    with serving(SpacedBackend()) as server:
        yield server


@pytest.fixture(scope="module")
def crlf_backend() -> Iterator[SpacedBackend]:
    with serving(SpacedBackend(CRLF_MODEL, b"\r\n", hold_last=True)) as server:
        yield server


@pytest.fixture(scope="module")
def gateway(
    backend: SpacedBackend, crlf_backend: SpacedBackend, start_module_gateway: ModuleGatewayStarter
) -> Server:
    backends = [
        fleet_backend("spaced", backend.url),
        fleet_backend("crlf", crlf_backend.url, model=CRLF_MODEL),
    ]
    server, _ = start_module_gateway(backends)
    price = {"gpu_type": "B200", "usd_per_gpu_hour": 6.0, "source": "test", "date": "2026-11-01"}
    created = httpx.post(f"{server.base_url}/admin/v1/prices", json=price, headers=ADMIN)
    assert created.status_code == 201, created.text
    return server


def client_reads(text: str, line_end: str = "\n") -> list[Any]:
    """Each event's data as a client reads it: `data:` lines joined by newlines, parsed."""
    events = []
    for event in text.split(line_end * 2)[:-1]:
        lines = [line.removeprefix("data: ") for line in event.split(line_end)]
        data = "\n".join(lines)
        events.append(data if data == "[DONE]" else json.loads(data))
    return events


def _record(gateway: Server, request_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + LEDGER_WAIT_S
    while time.monotonic() < deadline:
        page = httpx.get(
            f"{gateway.base_url}/admin/v1/usage", params={"limit": 100}, headers=ADMIN
        ).json()["data"]
        found = [r for r in page if r["client_request_id"] == request_id]
        if found:
            return dict(found[0])
        time.sleep(0.1)
    pytest.fail(f"no usage record of {request_id} after {LEDGER_WAIT_S} s")


@pytest.mark.parametrize("include_usage", [False, True])
def test_spaced_usage_is_recorded_and_shown_only_when_asked(
    gateway: Server, backend: SpacedBackend, include_usage: bool
) -> None:
    rid = uuid.uuid4().hex
    body: dict[str, Any] = {
        "model": SIM_MODEL,
        "stream": True,
        "messages": [{"role": "user", "content": "How do drafts pass?"}],
    }
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    with httpx.Client(base_url=gateway.base_url, timeout=30.0) as http:
        reply = http.post("/v1/chat/completions", json=body, headers={"x-request-id": rid})
    assert reply.status_code == 200, reply.text
    assert backend.asked[-1] == {"include_usage": True, "continuous_usage_stats": True}
    record = _record(gateway, rid)
    assert (record["prompt_tokens"], record["completion_tokens"]) == (PROMPT_TOKENS, len(WORDS))
    assert record["cost_usd"] > 0
    *chunks, done = client_reads(reply.text)
    assert done == "[DONE]"
    content = [c for c in chunks if c["choices"]]
    assert "".join(c["choices"][0]["delta"]["content"] for c in content) == "".join(WORDS)
    assert not any("usage" in c for c in content)  # continuous usage was not asked
    usage_only = [c for c in chunks if not c["choices"]]
    assert [c["usage"] for c in usage_only] == ([_usage(len(WORDS))] if include_usage else [])


@pytest.mark.parametrize("include_usage", [False, True])
def test_crlf_events_reach_the_client_as_they_come_and_are_counted(
    gateway: Server, crlf_backend: SpacedBackend, include_usage: bool
) -> None:
    r"""Events ending in `\r\n\r\n`: the client holds the first before the backend sends its
    last (which waits for it), the ledger holds the exact usage, and the client's bytes keep
    the backend's line ends and lack the usage it did not ask for."""
    rid = uuid.uuid4().hex
    crlf_backend.first_seen.clear()
    body: dict[str, Any] = {
        "model": CRLF_MODEL,
        "stream": True,
        "messages": [{"role": "user", "content": "How do drafts pass?"}],
    }
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    received = b""
    with (
        httpx.Client(base_url=gateway.base_url, timeout=30.0) as http,
        http.stream(
            "POST", "/v1/chat/completions", json=body, headers={"x-request-id": rid}
        ) as reply,
    ):
        assert reply.status_code == 200, reply.read()
        for piece in reply.iter_bytes():
            received += piece
            if b"\r\n\r\n" in received:
                crlf_backend.first_seen.set()
    assert crlf_backend.held[-1], "the gateway held the first event until the backend's last"
    assert crlf_backend.asked[-1] == {"include_usage": True, "continuous_usage_stats": True}
    record = _record(gateway, rid)
    assert (record["prompt_tokens"], record["completion_tokens"]) == (PROMPT_TOKENS, len(WORDS))
    assert record["cost_usd"] > 0
    assert received.count(b"\n") == received.count(b"\r\n")  # every line as the backend ended it
    *chunks, done = client_reads(received.decode(), "\r\n")
    assert done == "[DONE]"
    content = [c for c in chunks if c["choices"]]
    assert "".join(c["choices"][0]["delta"]["content"] for c in content) == "".join(WORDS)
    assert not any("usage" in c for c in content)  # continuous usage was not asked
    usage_only = [c for c in chunks if not c["choices"]]
    assert [c["usage"] for c in usage_only] == ([_usage(len(WORDS))] if include_usage else [])
