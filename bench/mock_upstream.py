"""A cheap mock vLLM upstream: OpenAI routes with vLLM's exact JSON and SSE chunk shapes.

Raw asyncio over httptools (uvloop when installed), so it costs far less per request than the
proxies it is used to measure. Every response has `--tokens` tokens. With `--token-delay-ms`
above 0, one timer steps all open responses together (like vLLM's batched decode steps), so
256 concurrent streams cost one timer per step, not 256.

Run: .venv/bin/python bench/mock_upstream.py --port 8001 [--token-delay-ms 5] [--model mock-model]
Routes: GET /health, GET /v1/models, GET /metrics, POST /v1/chat/completions, POST /v1/completions.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import httptools

WORDS = (" the", " quick", " brown", " fox", " jumps", " over", " a", " lazy", " dog", ".")
DONE = b"data: [DONE]\n\n"
SSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
SSE_HEAD += b"transfer-encoding: chunked\r\n"


@dataclass(frozen=True)
class Config:
    """What the mock serves."""

    model: str
    tokens: int
    token_delay_s: float


@dataclass(eq=False)  # hashed by identity: the stepper keeps a set of them
class Job:
    """One response in progress: `sent` tokens of `total` so far."""

    protocol: UpstreamProtocol
    write: Callable[[Job], None]
    head: str
    chat: bool
    stream: bool
    include_usage: bool
    continuous_usage: bool
    prompt_tokens: int
    total: int
    keep_alive: bool
    sent: int = 0
    text: list[str] = field(default_factory=list)


def usage_json(prompt_tokens: int, completion_tokens: int) -> str:
    """vLLM's usage object, in its field order."""
    return (
        f'{{"prompt_tokens":{prompt_tokens},"total_tokens":{prompt_tokens + completion_tokens},'
        f'"completion_tokens":{completion_tokens}}}'
    )


def chunked(data: bytes) -> bytes:
    """One HTTP/1.1 chunk."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def plain_response(status: int, body: bytes, content_type: bytes, keep_alive: bool) -> bytes:
    """A complete response with a Content-Length."""
    reason = {200: b"OK", 400: b"Bad Request", 404: b"Not Found"}.get(status, b"Error")
    connection = b"keep-alive" if keep_alive else b"close"
    return (
        b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\nconnection: %s\r\n\r\n%s"
        % (status, reason, content_type, len(body), connection, body)
    )


def json_response(status: int, body: str, keep_alive: bool) -> bytes:
    """A JSON response."""
    return plain_response(status, body.encode(), b"application/json", keep_alive)


def vllm_error(status: int, message: str, kind: str, keep_alive: bool) -> bytes:
    """vLLM's error envelope."""
    body = {"object": "error", "message": message, "type": kind, "param": None, "code": status}
    return json_response(status, json.dumps(body), keep_alive)


def count_words(value: Any) -> int:
    """A rough prompt token count: whitespace-separated words in every string."""
    if isinstance(value, str):
        return len(value.split())
    if isinstance(value, list):
        return sum(count_words(v) for v in value)
    if isinstance(value, dict):
        return sum(count_words(v) for v in value.values())
    return 0


def content_chunk(job: Job, index: int) -> bytes:
    """The SSE event carrying token `index` (the last one carries the finish reason)."""
    text = json.dumps(WORDS[index % len(WORDS)])
    finish = '"length"' if index == job.total - 1 else "null"
    if job.chat:
        choice = f'{{"index":0,"delta":{{"content":{text}}},"logprobs":null,'
    else:
        choice = f'{{"index":0,"text":{text},"logprobs":null,'
    choice += f'"finish_reason":{finish},"stop_reason":null}}'
    extra = f',"usage":{usage_json(job.prompt_tokens, index + 1)}' if job.continuous_usage else ""
    return f"{job.head}{choice}]{extra}}}\n\n".encode()


def role_chunk(job: Job) -> bytes:
    """The first chat event, announcing the assistant role."""
    choice = '{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,'
    choice += '"finish_reason":null}'
    extra = f',"usage":{usage_json(job.prompt_tokens, 0)}' if job.continuous_usage else ""
    return f"{job.head}{choice}]{extra}}}\n\n".encode()


def closing_events(job: Job) -> bytes:
    """The usage event (when asked for) and `[DONE]`."""
    tail = b""
    if job.include_usage:
        usage = usage_json(job.prompt_tokens, job.total)
        tail = chunked(f'{job.head}],"usage":{usage}}}\n\n'.encode())
    return tail + chunked(DONE) + b"0\r\n\r\n"


def full_body(job: Job) -> bytes:
    """The non-streaming response body."""
    text = json.dumps("".join(WORDS[i % len(WORDS)] for i in range(job.total)))
    body = job.head.removeprefix("data: ").replace(".chunk", "")
    if job.chat:
        message = f'{{"role":"assistant","content":{text},"refusal":null,"tool_calls":[]}}'
        choice = f'{{"index":0,"message":{message},'
    else:
        choice = f'{{"index":0,"text":{text},'
    choice += '"logprobs":null,"finish_reason":"length","stop_reason":null}'
    usage = usage_json(job.prompt_tokens, job.total)
    return f'{body}{choice}],"usage":{usage},"prompt_logprobs":null}}'.encode()


class Stepper:
    """Advances every open response by one token per step, on one shared timer."""

    def __init__(self, loop: asyncio.AbstractEventLoop, delay_s: float) -> None:
        self.loop, self.delay_s = loop, delay_s
        self.jobs: set[Job] = set()
        self.next_at = 0.0
        self.handle: asyncio.TimerHandle | None = None

    def add(self, job: Job) -> None:
        self.jobs.add(job)
        if self.handle is None:
            self.next_at = self.loop.time() + self.delay_s
            self.handle = self.loop.call_at(self.next_at, self.step)

    def step(self) -> None:
        for job in list(self.jobs):
            if job.protocol.closed:
                self.jobs.discard(job)
                continue
            job.write(job)
            if job.sent >= job.total:
                self.jobs.discard(job)
        self.handle = None
        if self.jobs:
            # A fixed schedule, so a slow step does not stretch every later one.
            self.next_at = max(self.next_at + self.delay_s, self.loop.time())
            self.handle = self.loop.call_at(self.next_at, self.step)


class UpstreamProtocol(asyncio.Protocol):
    """One client connection; requests are answered in order."""

    ids = itertools.count()

    def __init__(self, config: Config, stepper: Stepper) -> None:
        self.config, self.stepper = config, stepper
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.busy = False  # a delayed response is still being written
        self.queued: list[tuple[bytes, bytes, bool, bytes]] = []
        self.url = b""
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports do not subclass asyncio.Transport, so no isinstance check.
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            # Also what an exception in a handler arrives as: say it, then refuse the request.
            print(f"mock upstream: {exc!r} (cause {exc.__cause__!r})", file=sys.stderr)
            self.send(plain_response(400, b"bad request", b"text/plain", False), False)

    def on_message_begin(self) -> None:
        self.url, self.body = b"", []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        method = self.parser.get_method()
        request = (method, self.url, self.parser.should_keep_alive(), b"".join(self.body))
        if self.busy:
            self.queued.append(request)  # pipelined behind a response still in progress
        else:
            self.handle(*request)

    def send(self, data: bytes, keep_alive: bool) -> None:
        if self.closed or self.transport is None:
            return
        self.transport.write(data)
        if not keep_alive:
            self.transport.close()
            self.closed = True

    def handle(self, method: bytes, url: bytes, keep_alive: bool, body: bytes) -> None:
        path = url.split(b"?", 1)[0]
        if path in (b"/v1/chat/completions", b"/v1/completions") and method == b"POST":
            self.start_completion(path == b"/v1/chat/completions", body, keep_alive)
        elif path == b"/health" and method == b"GET":
            self.send(plain_response(200, b"", b"application/json", keep_alive), keep_alive)
        elif path == b"/v1/models" and method == b"GET":
            self.send(json_response(200, self.models_body(), keep_alive), keep_alive)
        elif path == b"/metrics" and method == b"GET":
            text = self.metrics_text().encode()
            content_type = b"text/plain; version=0.0.4"
            self.send(plain_response(200, text, content_type, keep_alive), keep_alive)
        else:
            self.send(json_response(404, '{"detail":"Not Found"}', keep_alive), keep_alive)

    def models_body(self) -> str:
        model = json.dumps(self.config.model)
        return (
            f'{{"object":"list","data":[{{"id":{model},"object":"model","created":'
            f'{int(time.time())},"owned_by":"vllm","root":{model},"parent":null,'
            f'"max_model_len":8192,"permission":[]}}]}}'
        )

    def metrics_text(self) -> str:
        label = f'{{model_name="{self.config.model}"}}'
        running = len(self.stepper.jobs)
        return (
            f"vllm:num_requests_running{label} {running}.0\n"
            f"vllm:num_requests_waiting{label} 0.0\n"
            f"vllm:kv_cache_usage_perc{label} 0.0\n"
        )

    def start_completion(self, chat: bool, raw: bytes, keep_alive: bool) -> None:
        try:
            request = json.loads(raw)
        except ValueError:
            request = None
        if not isinstance(request, dict):
            message = "the body must be a JSON object"
            self.send(vllm_error(400, message, "BadRequestError", keep_alive), keep_alive)
            return
        if request.get("model") != self.config.model:
            message = f"The model `{request.get('model')}` does not exist."
            self.send(vllm_error(404, message, "NotFoundError", keep_alive), keep_alive)
            return
        job = self.new_job(chat, request, keep_alive)
        if self.config.token_delay_s == 0:
            self.write_all(job)
            return
        self.busy = True
        if job.stream:
            self.send(SSE_HEAD + b"\r\n" + (chunked(role_chunk(job)) if chat else b""), True)
        self.stepper.add(job)

    def new_job(self, chat: bool, request: dict[str, Any], keep_alive: bool) -> Job:
        options = request.get("stream_options") or {}
        kind = "chat.completion.chunk" if chat else "text_completion"
        prefix = "chatcmpl" if chat else "cmpl"
        head = (
            f'data: {{"id":"{prefix}-{next(self.ids):032x}","object":"{kind}",'
            f'"created":{int(time.time())},"model":{json.dumps(self.config.model)},"choices":['
        )
        limit = request.get("max_completion_tokens") or request.get("max_tokens")
        total = min(self.config.tokens, limit) if isinstance(limit, int) else self.config.tokens
        stream = bool(request.get("stream"))
        return Job(
            protocol=self,
            write=self.write_step,
            head=head,
            chat=chat,
            stream=stream,
            include_usage=stream and bool(options.get("include_usage")),
            continuous_usage=stream and bool(options.get("continuous_usage_stats")),
            prompt_tokens=count_words(request.get("messages" if chat else "prompt")),
            total=max(total, 1),
            keep_alive=keep_alive,
        )

    def write_all(self, job: Job) -> None:
        """The whole response in one write (no token delay)."""
        if not job.stream:
            self.send(json_response(200, full_body(job).decode(), job.keep_alive), job.keep_alive)
            return
        parts = [SSE_HEAD, b"\r\n"]
        if job.chat:
            parts.append(chunked(role_chunk(job)))
        parts.extend(chunked(content_chunk(job, i)) for i in range(job.total))
        parts.append(closing_events(job))
        self.send(b"".join(parts), job.keep_alive)

    def write_step(self, job: Job) -> None:
        """One token of a delayed response; the response's end on the last one."""
        job.sent += 1
        if job.stream:
            data = chunked(content_chunk(job, job.sent - 1))
            self.send(data + closing_events(job) if job.sent >= job.total else data, True)
        elif job.sent >= job.total:
            self.send(json_response(200, full_body(job).decode(), job.keep_alive), True)
        if job.sent >= job.total:
            self.finish(job.keep_alive)

    def finish(self, keep_alive: bool) -> None:
        """After a delayed response: close if asked, else answer what was pipelined behind it."""
        self.busy = False
        if not keep_alive and self.transport is not None:
            self.transport.close()
            self.closed = True
            return
        while self.queued and not self.busy and not self.closed:
            self.handle(*self.queued.pop(0))


async def serve(host: str, port: int, config: Config) -> None:
    """Serve until SIGINT or SIGTERM."""
    loop = asyncio.get_running_loop()
    stepper = Stepper(loop, config.token_delay_s)
    server = await loop.create_server(
        lambda: UpstreamProtocol(config, stepper), host, port, backlog=4096, reuse_address=True
    )
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    print(f"mock upstream on http://{host}:{port} ({config})", file=sys.stderr, flush=True)
    await stop.wait()
    server.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--model", default="mock-model", help="the served model name")
    parser.add_argument("--tokens", type=int, default=32, help="tokens per response")
    parser.add_argument("--token-delay-ms", type=float, default=0.0, help="delay per token")
    args = parser.parse_args()
    config = Config(args.model, args.tokens, args.token_delay_ms / 1000)
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(args.host, args.port, config))
    else:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(serve(args.host, args.port, config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
