"""A backend that writes its stream's JSON with spaces (`"usage": {`, `"choices": []`, events
pretty-printed over several `data:` lines, each written in small pieces) behind the real
gateway: the ledger holds its exact usage, and a client sees only the usage it asked for."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
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


class SpacedBackend(ThreadingHTTPServer):
    """A chat backend on loopback whose streams are JSON as `json.dumps` writes it by
    default; it keeps the `stream_options` each request asked of it."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _SpacedHandler)
        self.asked: list[dict[str, Any]] = []

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


def spaced_stream(include_usage: bool, continuous: bool) -> bytes:
    """The whole stream: a chunk per word (every other one pretty-printed), cumulative usage
    on each when `continuous`, the usage-only chunk when `include_usage`, then `[DONE]`."""
    head = {
        "id": "chatcmpl-spaced",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": SIM_MODEL,
    }
    events = []
    for n, word in enumerate(WORDS, 1):
        choice = {"index": 0, "delta": {"content": word}, "finish_reason": None}
        body = head | {"choices": [choice]} | ({"usage": _usage(n)} if continuous else {})
        events.append((_pretty if n % 2 else _spaced)(body))
    if include_usage:
        events.append(_spaced(head | {"choices": [], "usage": _usage(len(WORDS))}))
    return b"".join([*events, b"data: [DONE]\n\n"])


class _SpacedHandler(BaseHTTPRequestHandler):
    server: SpacedBackend

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._answer(200, {"object": "list", "data": [{"id": SIM_MODEL}]})
        elif self.path == "/health":
            self._answer(200, None)
        else:
            self._answer(404, {"error": {"message": "not found"}})

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))))
        options = request.get("stream_options") or {}
        self.server.asked.append(options)
        stream = spaced_stream(
            options.get("include_usage") is True, options.get("continuous_usage_stats") is True
        )
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()  # HTTP/1.0: the body ends when the connection closes
        for at in range(0, len(stream), PIECE_BYTES):
            self.wfile.write(stream[at : at + PIECE_BYTES])
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


@pytest.fixture(scope="module")
def backend() -> Iterator[SpacedBackend]:
    server = SpacedBackend()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def gateway(backend: SpacedBackend, start_module_gateway: ModuleGatewayStarter) -> Server:
    server, _ = start_module_gateway([fleet_backend("spaced", backend.url)])
    price = {"gpu_type": "B200", "usd_per_gpu_hour": 6.0, "source": "test", "date": "2026-11-01"}
    created = httpx.post(f"{server.base_url}/admin/v1/prices", json=price, headers=ADMIN)
    assert created.status_code == 201, created.text
    return server


def client_reads(text: str) -> list[Any]:
    """Each event's data as a client reads it: `data:` lines joined by newlines, parsed."""
    events = []
    for event in text.split("\n\n")[:-1]:
        lines = [line.removeprefix("data: ") for line in event.split("\n")]
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
