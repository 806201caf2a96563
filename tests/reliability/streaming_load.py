"""Closed-loop streaming clients for the reliability tests, counted on the client side.

Each client thread sends streamed chat completions one after another until told to stop,
every request with an `x-request-id` of its own, and keeps what it saw: status, whether the
stream ended with `[DONE]` and no error event, and the usage the last chunk reported.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import httpx

CHAT = [{"role": "user", "content": "Tell me about reliability."}]
REQUEST_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Outcome:
    """What the client saw of one request."""

    request_id: str
    base_url: str
    status: int  # 0 when the connection failed
    completed: bool  # 200, no error event, and the stream ended with [DONE]
    completion_tokens: int
    prompt_tokens: int
    method: str | None  # the x-draftgate-method header
    started_s: float  # time.time() when sent
    error: str = ""


def stream_once(
    http: httpx.Client, base_url: str, model: str, max_tokens: int, api_key: str | None = None
) -> Outcome:
    """Send one streamed chat completion and read it to the end."""
    request_id, started = uuid.uuid4().hex, time.time()
    headers = {"x-request-id": request_id}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    body = {
        "model": model,
        "messages": CHAT,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    try:
        with http.stream(
            "POST", f"{base_url}/v1/chat/completions", json=body, headers=headers
        ) as response:
            if response.status_code != 200:
                response.read()
                return Outcome(
                    request_id,
                    base_url,
                    response.status_code,
                    False,
                    0,
                    0,
                    response.headers.get("x-draftgate-method"),
                    started,
                    response.text[:200],
                )
            return _read_stream(response, request_id, base_url, started)
    except httpx.HTTPError as exc:
        return Outcome(request_id, base_url, 0, False, 0, 0, None, started, repr(exc))


def _read_stream(
    response: httpx.Response, request_id: str, base_url: str, started: float
) -> Outcome:
    done, error, usage = False, "", {}
    for line in response.iter_lines():
        if not line.startswith("data: "):
            continue
        data = line.removeprefix("data: ")
        if data == "[DONE]":
            done = True
            continue
        chunk = json.loads(data)
        if "error" in chunk:
            error = json.dumps(chunk["error"])[:200]
        if chunk.get("usage"):
            usage = chunk["usage"]
    return Outcome(
        request_id,
        base_url,
        response.status_code,
        done and not error,
        int(usage.get("completion_tokens", 0)),
        int(usage.get("prompt_tokens", 0)),
        response.headers.get("x-draftgate-method"),
        started,
        error,
    )


@dataclass
class StreamingLoad:
    """`clients` threads streaming against `base_urls` (round robin) until `stop()`."""

    base_urls: Sequence[str]
    model: str
    clients: int
    max_tokens: int = 16
    api_key: str | None = None
    pause_s: float = 0.0  # between one client's requests
    stagger_s: float = 0.0  # the clients' first requests spread over this, as real ones are
    outcomes: list[Outcome] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> StreamingLoad:
        """Start the client threads."""
        for i in range(self.clients):
            thread = threading.Thread(target=self._client, args=(i,), daemon=True)
            self._threads.append(thread)
            thread.start()
        return self

    def _client(self, index: int) -> None:
        timeout = httpx.Timeout(REQUEST_TIMEOUT_S, connect=10.0)
        with httpx.Client(timeout=timeout) as http:
            n = index
            if self.stagger_s:
                self._stop.wait(index * self.stagger_s / self.clients)
            while not self._stop.is_set():
                url = self.base_urls[n % len(self.base_urls)]
                outcome = stream_once(http, url, self.model, self.max_tokens, self.api_key)
                with self._lock:
                    self.outcomes.append(outcome)
                n += 1
                if self.pause_s:
                    self._stop.wait(self.pause_s)

    def stop(self) -> list[Outcome]:
        """Stop sending, wait for the requests in flight; every outcome."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=REQUEST_TIMEOUT_S + 10)
        return list(self.outcomes)

    def count(self, predicate: Callable[[Outcome], bool] = lambda o: True) -> int:
        """Outcomes so far that satisfy `predicate`."""
        with self._lock:
            return sum(1 for o in self.outcomes if predicate(o))


def failures(outcomes: Sequence[Outcome]) -> list[Outcome]:
    """The requests that did not complete."""
    return [o for o in outcomes if not o.completed]
