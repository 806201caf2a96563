"""A webhook receiver for tests: a real HTTP server on a free 127.0.0.1 port, in a thread.

It records every request, checks each signature the way docs/webhooks.md tells a receiver
to (written here from that page, not taken from the gateway's code), and can be told to
answer the next N requests with an error, to prove retries.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

TOLERANCE_S = 300  # the docs' suggested window for the signature's timestamp
POLL_S = 0.05


def verify(secret: str, body: bytes, header: str | None, now: float | None = None) -> bool:
    """The check docs/webhooks.md gives a receiver: HMAC-SHA256 of `<t>.<body>`, fresh `t`."""
    if not header:
        return False
    fields = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
    if "t" not in fields or "v1" not in fields or not fields["t"].isdigit():
        return False
    now = time.time() if now is None else now
    if abs(now - int(fields["t"])) > TOLERANCE_S:
        return False
    signed = fields["t"].encode() + b"." + body
    expected = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, fields["v1"])


@dataclass(frozen=True)
class Received:
    """One request the receiver got, and what it answered."""

    path: str
    headers: dict[str, str]  # lower-case names
    body: bytes
    status: int
    signed: bool  # the signature checked out

    @property
    def event(self) -> dict[str, Any]:
        parsed: dict[str, Any] = json.loads(self.body)
        return parsed


class Receiver:
    """Records requests; answers 204, or `failing_status` to the next `fail_next` ones."""

    def __init__(self, secret: str) -> None:
        self.secret = secret
        self._lock = threading.Lock()
        self._received: list[Received] = []
        self._fail_next, self._failing_status = 0, 500
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": POLL_S}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}/hooks/draftgate"

    def fail(self, count: int, status: int = 500) -> None:
        """Answer the next `count` requests with `status`."""
        with self._lock:
            self._fail_next, self._failing_status = count, status

    @property
    def received(self) -> list[Received]:
        with self._lock:
            return list(self._received)

    def delivered(self, event_type: str | None = None) -> list[dict[str, Any]]:
        """Bodies of the events answered with success, in arrival order."""
        return [
            r.event
            for r in self.received
            if r.status < 300 and (event_type is None or r.event["type"] == event_type)
        ]

    def wait_for(
        self, check: Callable[[list[dict[str, Any]]], bool], what: str, timeout_s: float = 60.0
    ) -> list[dict[str, Any]]:
        """Poll the delivered events until `check` holds (a deadline, not a wait); them."""
        deadline = time.monotonic() + timeout_s
        while not check(events := self.delivered()):
            if time.monotonic() > deadline:
                kinds = [e["type"] for e in events]
                pytest.fail(f"{what} within {timeout_s} s; delivered: {kinds}")
            time.sleep(POLL_S)
        return events

    def _answer(self, path: str, headers: dict[str, str], body: bytes) -> int:
        signed = verify(self.secret, body, headers.get("x-draftgate-signature"))
        with self._lock:
            status = 204
            if self._fail_next:
                self._fail_next -= 1
                status = self._failing_status
            self._received.append(Received(path, headers, body, status, signed))
        return status

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                headers = {k.lower(): v for k, v in self.headers.items()}
                status = receiver._answer(self.path, headers, body)
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass  # the test's output stays the test's

        return Handler

    def start(self) -> Receiver:
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@contextmanager
def running_receiver(secret: str) -> Iterator[Receiver]:
    """A receiver listening for the length of the block."""
    receiver = Receiver(secret).start()
    try:
        yield receiver
    finally:
        receiver.close()
