"""The simulator's HTTP server: a plain ASGI app with vLLM's routes, over the engine runner."""

# Over 400 lines: one ASGI app: vLLM's routes over the engine runner, sharing its streams.

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import os
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from backends.sim import config as sim_config
from backends.sim import statlog
from backends.sim.config import SimConfig
from backends.sim.engine import SimRequest, natural_length
from backends.sim.metrics import SimMetrics
from backends.sim.prefix_cache import block_hashes
from backends.sim.protocol import (
    ApiError,
    Generation,
    parse_body,
    parse_messages,
    parse_responses,
)
from backends.sim.protocol import parse_generation as parse
from backends.sim.runner import EngineRunner, Stream, merged
from backends.sim.text import PseudoText, prompt_words, seed_of
from backends.sim.writers import MessagesWriter, ResponsesWriter, ResponseWriter
from planner import calibration

logger = logging.getLogger(__name__)
Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

MAX_BODY_BYTES = 32 * 1024 * 1024
JSON = [(b"content-type", b"application/json")]
SSE = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
# The request headers kept of each generation request, for GET /sim/trace-context: the W3C
# trace context (vLLM, built with OpenTelemetry, continues it) and the id to match them by.
TRACE_HEADERS = (b"x-request-id", b"traceparent", b"tracestate")
TRACE_CONTEXT_KEPT = 256  # requests, the newest
INVALID_REQUEST = "invalid_request_error"  # the type vLLM gives its response store's errors


class ConnectionDropped(Exception):
    """Raised mid-stream to cut the connection (the `drop_rate` fault)."""


class SimServer:
    """One simulated vLLM server; `__call__` is its ASGI entry point."""

    def __init__(self, config: SimConfig) -> None:
        config.check()
        self.config = config
        self.faults = config.faults
        self.max_model_len = sim_config.max_model_len(config)
        core = sim_config.build_engine(config)
        self.metrics = SimMetrics(
            config.name, self.max_model_len, core.k, prefix_caching=core.prefix_cache is not None
        )
        self.runner = EngineRunner(core, self.metrics, config.time_scale)
        self._rng = random.Random(config.seed)
        self._task: asyncio.Task[None] | None = None
        self._stats: asyncio.Task[None] | None = None  # the log's stats lines
        self.created = int(time.time())
        self.trace_context: deque[dict[str, str]] = deque(maxlen=TRACE_CONTEXT_KEPT)
        # vLLM's in-memory response store, on only as vLLM turns it on (never emptied there)
        self.store = os.environ.get("VLLM_ENABLE_RESPONSES_API_STORE", "0") not in ("", "0")
        self.responses: dict[str, dict[str, Any]] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            try:
                await self._route(scope, receive, send)
            except ApiError as exc:
                await _respond(send, exc.status, exc.body())

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await asyncio.sleep(self.faults.startup_delay_s)
                self._task = asyncio.create_task(self.runner.run())
                self._stats = asyncio.create_task(
                    statlog.log_forever(self.runner.take_tally, self.runner.state)
                )
                if self.faults.crash_after_s is not None:
                    asyncio.get_running_loop().call_later(self.faults.crash_after_s, _crash)
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                for task in (self._task, self._stats):
                    if task is not None:
                        task.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await task
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _route(self, scope: Scope, receive: Receive, send: Send) -> None:
        method, path = scope["method"], scope["path"]
        if self._refused(scope):
            await _respond(send, 401, b'{"error":"Unauthorized"}')
            return
        if method == "POST" and path.startswith("/v1/"):
            self._keep_trace_context(scope)
        if method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
            body = parse_body(await _read_body(receive))
            chat, name, room = (
                path.endswith("chat/completions"),
                self.config.name,
                self.max_model_len,
            )
            generation = parse(body, chat=chat, served_model=name, max_model_len=room)
            await self._generate(generation, receive, send)
        elif path == "/v1/responses" or path.startswith("/v1/responses/"):
            await self._responses(method, path, receive, send)
        elif method == "POST" and path == "/v1/messages":
            body = parse_body(await _read_body(receive))
            name, room = self.config.name, self.max_model_len
            generation = parse_messages(body, served_model=name, max_model_len=room)
            await self._generate(generation, receive, send)
        elif method == "GET" and path == "/health":
            await _respond(send, 200, b"")
        elif method == "GET" and path == "/version":
            await _respond(send, 200, json.dumps({"version": self.config.engine_version}).encode())
        elif method == "GET" and path == "/v1/models":
            await _respond(send, 200, self._models())
        elif method == "GET" and path == "/metrics":
            headers = [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")]
            await _respond(send, 200, self.metrics.exposition(), headers)
        elif method == "POST" and path == "/sim/faults":
            await self._set_faults(receive, send)
        elif method == "GET" and path == "/sim/trace-context":
            await _respond(send, 200, json.dumps(list(self.trace_context)).encode())
        else:
            raise ApiError(404, f"Not Found: {method} {path}")

    async def _responses(self, method: str, path: str, receive: Receive, send: Send) -> None:
        """The Responses API: a response (continuing a stored one), a stored one, its cancel."""
        stored_id = path.removeprefix("/v1/responses/")
        if method == "POST" and path == "/v1/responses":
            body = parse_body(await _read_body(receive))
            name, room = self.config.name, self.max_model_len
            generation = parse_responses(body, served_model=name, max_model_len=room)
            previous = body.get("previous_response_id")
            if previous is not None:  # the turns before are part of the prompt
                usage = self._stored(previous)["usage"] or {}
                history = usage.get("total_tokens", 0)
                generation = replace(generation, prompt_tokens=generation.prompt_tokens + history)
            await self._generate(generation, receive, send)
        elif method == "GET" and "/" not in stored_id:
            await _respond(send, 200, json.dumps(self._stored(stored_id)).encode())
        elif method == "POST" and stored_id.endswith("/cancel"):
            self._stored(stored_id.removesuffix("/cancel"))
            message = "Cannot cancel a synchronous response."
            raise ApiError(400, message, param="response_id", kind=INVALID_REQUEST)
        else:
            raise ApiError(404, f"Not Found: {method} {path}")

    def _stored(self, response_id: object) -> dict[str, Any]:
        """A stored response, or vLLM's 404 for an id it does not hold."""
        found = self.responses.get(response_id) if isinstance(response_id, str) else None
        if found is None:
            message = f"Response with id '{response_id}' not found."
            raise ApiError(404, message, param="response_id", kind=INVALID_REQUEST)
        return found

    def _writer(self, generation: Generation) -> ResponseWriter | ResponsesWriter | MessagesWriter:
        """The writer of a generation's answer; a Responses API answer the server stores
        is kept once complete."""
        writer = _writer(generation)
        if isinstance(writer, ResponsesWriter) and self.store and generation.store:
            writer.keep = self.responses.__setitem__
        return writer

    def _keep_trace_context(self, scope: Scope) -> None:
        """Keep the trace headers a request came with (not part of vLLM's API)."""
        headers = dict(scope["headers"])
        kept = {n.decode(): v.decode("latin-1") for n in TRACE_HEADERS if (v := headers.get(n))}
        self.trace_context.append(kept)

    def _refused(self, scope: Scope) -> bool:
        """Whether vLLM's `--api-key` check refuses the request: a /v1 route without the
        key (other routes, /health and /metrics among them, and OPTIONS are open)."""
        key = self.config.api_key
        if key is None or scope["method"] == "OPTIONS" or not scope["path"].startswith("/v1"):
            return False
        given = dict(scope["headers"]).get(b"authorization", b"")
        return not hmac.compare_digest(given, f"Bearer {key}".encode())

    def _models(self) -> bytes:
        card = {
            "id": self.config.name,
            "object": "model",
            "created": self.created,
            "owned_by": "vllm",
            "root": self.config.model,
            "parent": None,
            "max_model_len": self.max_model_len,
        }
        return json.dumps({"object": "list", "data": [card]}).encode()

    async def _set_faults(self, receive: Receive, send: Send) -> None:
        """Change fault switches at run time (not part of vLLM's API)."""
        body = parse_body(await _read_body(receive))
        try:
            self.faults = self.faults.updated(body)
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None
        await _respond(send, 200, json.dumps(self.faults.__dict__).encode())

    async def _generate(self, generation: Generation, receive: Receive, send: Send) -> None:
        if generation.priority and self.config.scheduling_policy != "priority":
            message = f"Got priority {generation.priority} but Priority scheduling is not enabled."
            raise ApiError(400, message)
        poisoned = bool(self.faults.poison) and self.faults.poison in generation.prompt_text
        if poisoned or self._rng.random() < self.faults.error_rate:
            message = "EngineCore encountered an issue. See stack trace (above) for the root cause."
            raise ApiError(500, message)
        if self.faults.delay_s:
            await asyncio.sleep(self.faults.delay_s)
        if generation.prompts:
            await self._generate_each(generation, receive, send)
            return
        prompt = (generation.prompt_text, generation.prompt_words(), generation.prompt_tokens)
        request, stream = self._submit(generation, *prompt)
        watcher = asyncio.create_task(_until_disconnect(receive, stream))
        try:
            if generation.stream:
                await self._stream(generation, stream, send)
            else:
                await self._respond_whole(generation, stream, send)
        finally:
            watcher.cancel()
            self.runner.abort(request)  # no-op once finished

    async def _generate_each(self, generation: Generation, receive: Receive, send: Send) -> None:
        """A completions list: a completion per prompt, side by side in the engine, as vLLM
        runs them (choices in list order, usage summed); fault switches apart from errors
        and delays leave such lists alone."""
        submitted = [self._submit(generation, text, prompt_words(text), tokens)
                     for text, tokens in generation.prompts]  # fmt: skip
        streams = [stream for _, stream in submitted]
        watcher = asyncio.create_task(_until_disconnect(receive, *streams))
        writer = ResponseWriter(generation)
        try:
            if generation.stream:
                await send({"type": "http.response.start", "status": 200, "headers": SSE})
                await self._stream_each(writer, streams, send)
            else:
                await self._respond_each(writer, streams, send)
        finally:
            watcher.cancel()
            for request, _ in submitted:
                self.runner.abort(request)  # no-op once finished

    async def _stream_each(self, writer: ResponseWriter, streams: list[Stream], send: Send) -> None:
        completions, first = [0] * len(streams), None
        async for index, text, value in merged(streams):
            if text is None and value == "abort":
                return
            if text is None:
                continue
            first = index if first is None else first
            completions[index] += value
            finish = self._finish_if_last(streams[index], completions[index])
            prompt = streams[index].request.prompt_tokens
            chunk = writer.text_chunk(text, finish, completions[index], index, prompt)
            await _send_body(send, chunk)
        # vLLM's usage says the cached tokens of the prompt whose output came first
        cached = self._cached_tokens(streams[first or 0].request)
        closing = writer.closing(sum(completions), None, cached)
        await send({"type": "http.response.body", "body": closing, "more_body": False})

    async def _respond_each(
        self, writer: ResponseWriter, streams: list[Stream], send: Send
    ) -> None:
        texts: list[list[str]] = [[] for _ in streams]
        reasons, completion = [""] * len(streams), 0
        async for index, text, value in merged(streams):
            if text is None and value == "abort":
                return
            if text is None:
                reasons[index] = value
                continue
            texts[index].append(text)
            completion += value
        choices = [("".join(parts), reason) for parts, reason in zip(texts, reasons, strict=True)]
        cached = self._cached_tokens(streams[-1].request)  # vLLM's: the last prompt's
        await _respond(send, 200, writer.full_choices(choices, completion, None, cached))

    def _submit(
        self, generation: Generation, text: str, words: list[str], prompt_tokens: int
    ) -> tuple[SimRequest, Stream]:
        """Queue one sequence of the request: its prompt's text, tokens (as strings) and
        token count."""
        seed = seed_of(text)
        workload = calibration.workloads().get(generation.workload or self.config.workload)
        mean_output = workload.output_tokens if workload else 512
        stop_at = generation.max_tokens
        if not generation.ignore_eos:
            stop_at = min(stop_at, natural_length(random.Random(seed), mean_output))
        profile = sim_config.acceptance_profile(self.config, workload.name if workload else None)
        cache = self.runner.core.prefix_cache
        blocks = block_hashes(words, cache.block_size) if cache is not None else ()
        request = SimRequest(
            request_id=f"req-{seed:x}",
            prompt_tokens=prompt_tokens,
            max_tokens=generation.max_tokens,
            stop_at=stop_at,
            acceptance=profile,
            arrived_s=self.runner.now_s(),
            block_hashes=blocks,
            priority=generation.priority,
        )
        diverge = self.faults.diverge_rate and self._rng.random() < self.faults.diverge_rate
        at = int(self.faults.diverge_at) if diverge else None
        return request, self.runner.submit(request, PseudoText(seed, at))

    async def _stream(self, generation: Generation, stream: Stream, send: Send) -> None:
        writer = self._writer(generation)
        await send({"type": "http.response.start", "status": 200, "headers": SSE})
        opening = writer.opening()
        if opening:
            await _send_body(send, opening)
        stall = self._rng.random() < self.faults.stall_rate
        drop = self._rng.random() < self.faults.drop_rate
        completion = 0
        while True:
            text, value = await stream.events.get()
            if text is None:
                break
            completion += value
            if (stall or drop) and completion * 2 >= stream.request.stop_at:
                await self._fault_mid_stream(stream, drop)
                return  # the client has gone; nothing more will arrive on this stream
            finish = self._finish_if_last(stream, completion)
            await _send_body(send, writer.text_chunk(text, finish, completion))
        if value == "abort":
            return
        metrics = self._request_metrics(stream.request) if generation.include_usage else None
        closing = writer.closing(completion, metrics, self._cached_tokens(stream.request))
        await send({"type": "http.response.body", "body": closing, "more_body": False})

    def _finish_if_last(self, stream: Stream, completion: int) -> str | None:
        """The finish reason to put on the chunk that completes the request."""
        request = stream.request
        if completion < request.stop_at:
            return None
        return "length" if request.stop_at >= request.max_tokens else "stop"

    async def _fault_mid_stream(self, stream: Stream, drop: bool) -> None:
        self.runner.abort(stream.request)
        if drop:
            raise ConnectionDropped("drop_rate fault: cutting the connection mid-stream")
        # Stall until the client leaves (its watcher's abort); the engine may already have
        # queued the rest of the request, its end included, which must not end the stall.
        while await stream.events.get() != (None, "abort"):
            pass

    async def _respond_whole(self, generation: Generation, stream: Stream, send: Send) -> None:
        writer, parts, completion = self._writer(generation), [], 0
        if self._rng.random() < self.faults.stall_rate:
            await self._fault_mid_stream(stream, drop=False)
            return
        while True:
            text, value = await stream.events.get()
            if text is None:
                break
            parts.append(text)
            completion += value
        if value == "abort":
            return
        metrics = self._request_metrics(stream.request)
        cached = self._cached_tokens(stream.request)
        body = writer.full_response("".join(parts), value, completion, metrics, cached)
        await _respond(send, 200, body)

    def _cached_tokens(self, request: SimRequest) -> int | None:
        """The prompt tokens its usage says were cached: vLLM's --enable-prompt-tokens-details
        (None without it: the usage says nothing of them)."""
        if not self.config.enable_prompt_tokens_details:
            return None
        return request.first_cached_tokens

    def _request_metrics(self, request: SimRequest) -> dict[str, Any] | None:
        """vLLM's `--per-request-spec-decode-metrics summary` block."""
        if not self.config.per_request_spec_metrics or not self.runner.core.k:
            return None
        spec = request.spec
        steps = max(spec.drafts, 1)
        summary = {
            "mean_acceptance_length": 1 + spec.accepted_tokens / steps,
            "draft_acceptance_rate": spec.accepted_tokens / max(spec.draft_tokens, 1),
            "acceptance_histogram": spec.histogram,
            "num_spec_steps": spec.drafts,
            "num_accepted_draft_tokens": spec.accepted_tokens,
            "num_draft_tokens": spec.draft_tokens,
            "num_spec_tokens": self.runner.core.k,
        }
        return {"speculative_decoding": summary}


def _writer(generation: Generation) -> ResponseWriter | ResponsesWriter | MessagesWriter:
    if generation.messages:
        return MessagesWriter(generation)
    return ResponsesWriter(generation) if generation.responses else ResponseWriter(generation)


async def _read_body(receive: Receive) -> bytes:
    chunks, size = [], 0
    while True:
        message: Message = await receive()
        if message["type"] == "http.disconnect":
            raise asyncio.CancelledError
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise ApiError(400, f"Request body larger than {MAX_BODY_BYTES} bytes")
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


async def _until_disconnect(receive: Receive, *streams: Stream) -> None:
    """Wake the response loop with an abort when the client goes away."""
    while (await receive())["type"] != "http.disconnect":
        pass
    for stream in streams:
        stream.events.put_nowait((None, "abort"))


async def _respond(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers or JSON})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _send_body(send: Send, chunk: bytes) -> None:
    await send({"type": "http.response.body", "body": chunk, "more_body": True})


def _crash() -> None:
    logger.error("crash_after_s fault: exiting now")
    os._exit(1)
