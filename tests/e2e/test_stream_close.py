"""A client that closes its stream on `data: [DONE]` has its whole answer: the official
`openai` client does so, and a vLLM server may end the stream's connection a moment after
its last event. The gateway used to count that close as a disconnect, cancel the request and
record it 499 `client_disconnect` (15 of 100 streams against real vLLM); the lossless
watchdog then never checked it. A backend here sends its stream, `[DONE]`, then holds the
connection a second before it ends it."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.conftest import (
    ADMIN_TOKEN,
    SIM_MODEL,
    ModuleGatewayStarter,
    Server,
    fleet_backend,
)

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
HOLD_S = 1.0  # how long the backend keeps the connection after `[DONE]`
WORDS = [" The", " end", " comes", " first."]
LEDGER_WAIT_S = 30.0  # a deadline, not a wait


def _event(body: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


def _stream(model: str) -> bytes:
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": model}
    events = [_event(chunk | {"choices": [{"index": 0, "delta": {"role": "assistant"}}]})]
    events += [_event(chunk | {"choices": [{"index": 0, "delta": {"content": w}}]}) for w in WORDS]
    usage = {"prompt_tokens": 5, "completion_tokens": len(WORDS), "total_tokens": 5 + len(WORDS)}
    events.append(_event(chunk | {"choices": [], "usage": usage}))
    return b"".join(events) + b"data: [DONE]\n\n"


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"object": "list", "data": [{"id": SIM_MODEL}]}).encode()
        self.send_response(200 if self.path in ("/health", "/v1/models") else 404)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", "0")))
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()  # HTTP/1.0: the body ends when the connection closes
        self.wfile.write(_stream(SIM_MODEL))
        self.wfile.flush()
        time.sleep(HOLD_S)  # the backend's own pace of ending a stream, not a wait of the test

    def log_message(self, format: str, *args: object) -> None:
        """Quiet."""


@pytest.fixture(scope="module")
def gateway(start_module_gateway: ModuleGatewayStarter) -> Iterator[Server]:
    backend = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    backend.daemon_threads = True
    thread = threading.Thread(target=backend.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{backend.server_address[1]}"
        server, _ = start_module_gateway([fleet_backend("holding", url)])
        yield server
    finally:
        backend.shutdown()
        backend.server_close()


def _records(gateway: Server, ids: set[str]) -> list[dict[str, Any]]:
    deadline = time.monotonic() + LEDGER_WAIT_S
    while time.monotonic() < deadline:
        page = httpx.get(
            f"{gateway.base_url}/admin/v1/usage", params={"limit": 1000}, headers=ADMIN
        ).json()["data"]
        found = [r for r in page if r["client_request_id"] in ids]
        if len(found) == len(ids):
            return found
        time.sleep(0.1)
    pytest.fail(f"not every record of {len(ids)} requests written")


def test_a_stream_closed_on_its_done_event_is_recorded_whole(gateway: Server) -> None:
    ids = set()
    for _ in range(3):
        request_id = str(uuid.uuid4())
        ids.add(request_id)
        client = openai.OpenAI(
            base_url=f"{gateway.base_url}/v1",
            api_key="none",
            max_retries=0,
            default_headers={"x-request-id": request_id},
        )
        with client:
            stream = client.chat.completions.create(
                model=SIM_MODEL,
                messages=[{"role": "user", "content": "end"}],
                stream=True,
                stream_options={"include_usage": True},
            )
            text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert text == "".join(WORDS)
    records = _records(gateway, ids)
    outcomes = [(r["status_code"], r["outcome"], r["completion_tokens"]) for r in records]
    assert outcomes == [(200, "ok", len(WORDS))] * 3
