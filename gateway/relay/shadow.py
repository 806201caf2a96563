"""The lossless watchdog: a sampled greedy answer replayed on the model's reference method.

Speculative decoding is lossless when its verify path is right: under greedy decoding the
answer must be the one the target model alone gives. A kernel or sampler bug, a drafter
loaded against the wrong target, a version's crash path break that quietly. So a share of
eligible requests (`DRAFTGATE_LOSSLESS_SAMPLE_SHARE`: greedy, one choice, chat or text
completions, from a key that has not opted out) keep a transcript of their answer as it goes
to the client; once it has gone, the request is queued (bounded; a cap per minute) and
replayed, one at a time per process, through this same relay onto a healthy backend of the
model's reference method (plain, unless `DRAFTGATE_LOSSLESS_REFERENCE` names another). The
replay is a request like any other, without a key: routed, priced and recorded in the
ledger, as the class `lossless-replay`, so what the assurance costs is a line of its own.

The two answers are compared by their token ids where the engine returned them for both
(vLLM's `return_token_ids`, asked by the gateway and cut out of the client's answer unless it
asked too: gateway/relay/transcripts.py), else as text (reasoning, content and tool-call
arguments, each whole): equal or not, and the length of their common prefix, in tokens or
characters, which is where they first differ. Nothing of either is kept beyond that and
their SHA-256 hashes.

A sampled request with a `seed` but a temperature above 0 is not eligible: speculative
decoding keeps the target's distribution, not its random draws (rejection sampling draws
differently), so such answers differ from plain's even when nothing is wrong.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from gateway.metrics import GatewayMetrics
from gateway.registry import BackendState, KeyView, Snapshot
from gateway.relay.asgi import Message, Receive, Scope, Send
from gateway.relay.transcripts import Sample, Transcript, common_prefix, greedy
from gateway.settings import Settings

if TYPE_CHECKING:
    from gateway.relay.exchange import Exchange

logger = logging.getLogger(__name__)

REPLAY = "draftgate.lossless_replay"  # the scope key a replay carries: its ReplayOrder
REPLAY_CLASS = "lossless-replay"  # the request class a replay is recorded under
ELIGIBLE_PATHS = frozenset(("/v1/chat/completions", "/v1/completions"))
DEFAULT_REFERENCE = "plain"


@dataclass(frozen=True, slots=True)
class Check:
    """One comparison, as stored (gateway/db/tables.py `LosslessCheck`)."""

    model: str
    method: str
    k: int | None
    drafter: str | None
    backend_name: str
    engine_version: str | None
    reference_method: str
    reference_backend: str
    reference_engine_version: str | None
    unit: str
    served_length: int
    reference_length: int
    common_prefix: int
    diverged: bool
    served_sha256: str
    reference_sha256: str
    served_request_id: str
    replay_request_id: str


def _sha256(answer: str | list[int]) -> str:
    """The hash kept of an answer: of its text (UTF-8), or of its token ids written as
    decimals joined by commas."""
    text = answer if isinstance(answer, str) else ",".join(map(str, answer))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _compared(served: _Served, answer: Transcript) -> tuple[str, str | list[int], str | list[int]]:
    """The unit of comparison and both answers in it: tokens where both have their ids,
    else characters."""
    ids = answer.ids()
    if served.ids is not None and ids is not None:
        return "token", served.ids, ids
    return "char", served.text, answer.text() or ""


@dataclass
class ReplayOrder:
    """What a replay's scope carries to the relay: the method it must run on; the relay
    hands back the replay's exchange (its backend, record id and status)."""

    method: str
    exchange: Exchange | None = None


@dataclass(frozen=True, slots=True)
class _Served:
    """A sampled request once answered: what the replay is compared with."""

    sample: Sample
    text: str
    ids: list[int] | None  # its token ids, where the engine returned them
    model: str
    request_id: str  # its usage record's
    backend: str
    method: str
    k: int | None
    drafter: str | None


Store = Callable[[Check], None]  # writes a check (blocking: it is run in a thread)
Relay = Callable[[Scope, Receive, Send], Awaitable[None]]


class Shadow:
    """Samples requests on the hot path; replays and compares them in `run`, off it."""

    def __init__(
        self,
        share: float,
        per_minute: int,
        queue: int,
        references: Mapping[str, str],
        metrics: GatewayMetrics,
        states: Mapping[str, BackendState],
        store: Store,
        rng: random.Random | None = None,
    ) -> None:
        self.share, self.per_minute, self.references = share, per_minute, references
        self.metrics, self.states, self.store = metrics, states, store
        self.rng = rng or random.Random()  # noqa: S311  (sampling, not secrets)
        self.queue: asyncio.Queue[_Served] = asyncio.Queue(queue)
        # A token bucket: `per_minute` a minute, evenly, at most a tenth of a minute's at once
        self._burst = max(1.0, per_minute / 10)
        self._tokens, self._filled_at = self._burst, time.monotonic()

    @classmethod
    def of(
        cls,
        settings: Settings,
        metrics: GatewayMetrics,
        states: Mapping[str, BackendState],
        store: Store,
    ) -> Shadow | None:
        """The watchdog as `settings` say (None when it samples nothing)."""
        if not settings.lossless_sample_share:
            return None
        return cls(
            settings.lossless_sample_share, settings.lossless_max_per_minute,
            settings.lossless_queue, settings.lossless_references, metrics, states, store,
        )  # fmt: skip

    def sample(self, path: str, payload: dict[str, Any], key: KeyView | None) -> Sample | None:
        """A sample of this request, or None (not eligible, or not drawn)."""
        if path not in ELIGIBLE_PATHS or (key is not None and key.lossless_opt_out):
            return None
        if not greedy(payload) or self.rng.random() >= self.share:
            return None
        return Sample(path, payload)

    def offer(self, x: Exchange) -> None:
        """A sampled request has ended: queue its replay if it was served whole, within the
        cap per minute and the queue's room."""
        sample, backend, model = x.sample, x.backend, x.model
        if sample is None or backend is None or model is None:
            return
        if x.status != 200 or x.outcome != "ok" or (text := sample.transcript.text()) is None:
            return
        if not self._allowed(time.monotonic()):
            self.metrics.lossless_dropped.labels(model, "cap").inc()
            return
        served = _Served(
            sample, text, sample.transcript.ids(), model, x.ledger_id, backend.name,
            backend.method, backend.k, backend.drafter,
        )  # fmt: skip
        try:
            self.queue.put_nowait(served)
        except asyncio.QueueFull:
            self.metrics.lossless_dropped.labels(model, "queue").inc()
            return
        self._tokens -= 1

    def _allowed(self, now: float) -> bool:
        """Whether the cap leaves room for one more replay now (spread over the minute)."""
        refill = (now - self._filled_at) * self.per_minute / 60
        self._tokens, self._filled_at = min(self._burst, self._tokens + refill), now
        return self._tokens >= 1

    async def run(
        self, relay: Relay, snapshot: Callable[[], Snapshot], stop: asyncio.Event
    ) -> None:
        """Replay the queued samples one at a time until `stop`."""
        stopping = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set():
                taking = asyncio.ensure_future(self.queue.get())
                await asyncio.wait((taking, stopping), return_when=asyncio.FIRST_COMPLETED)
                if not taking.done():
                    taking.cancel()
                    return
                try:
                    await self._check(relay, snapshot(), taking.result())
                except Exception:  # one failed check must not stop the watchdog
                    logger.exception("a lossless check failed")
        finally:
            stopping.cancel()

    async def _check(self, relay: Relay, snapshot: Snapshot, served: _Served) -> None:
        reference = self.references.get(served.model, DEFAULT_REFERENCE)
        now = time.monotonic()
        pool = snapshot.pools.get(served.model, {}).get(reference, ())
        if not any(self.states[b.name].available(now) for b in pool if b.name in self.states):
            self.metrics.lossless_dropped.labels(served.model, "no_reference").inc()
            return
        order = ReplayOrder(reference)
        status, body = await replay(relay, served.sample, order)
        x = order.exchange
        if status != 200 or x is None or x.backend is None:
            self.metrics.lossless_dropped.labels(served.model, "replay_failed").inc()
            return
        answer = Transcript()
        answer.whole(_json(body))
        if answer.text() is None:
            self.metrics.lossless_dropped.labels(served.model, "replay_failed").inc()
            return
        await self._record(served, reference, x, answer)

    async def _record(
        self, served: _Served, reference: str, x: Exchange, answer: Transcript
    ) -> None:
        assert x.backend is not None
        unit, ours, theirs = _compared(served, answer)
        shared = common_prefix(ours, theirs)
        diverged = ours != theirs
        versions = (self.states.get(served.backend), self.states.get(x.backend.name))
        served_version, reference_version = (s.engine_version if s else None for s in versions)
        check = Check(
            served.model, served.method, served.k, served.drafter, served.backend,
            served_version, reference, x.backend.name, reference_version, unit,
            len(ours), len(theirs), shared, diverged, _sha256(ours), _sha256(theirs),
            served.request_id, x.ledger_id,
        )  # fmt: skip
        result = "diverged" if diverged else "match"
        self.metrics.lossless_checks.labels(
            served.model, served.method, served.backend, reference, result
        ).inc()
        if diverged:
            logger.warning(
                "lossless check: %s on %s (%s) differs from %s on %s from %s %d of %d",
                served.model, served.backend, served.method, reference, x.backend.name, unit,
                shared, len(ours),
            )  # fmt: skip
        await asyncio.to_thread(self.store, check)


def _json(content: bytes) -> dict[str, Any] | None:
    try:
        body = orjson.loads(content)
    except orjson.JSONDecodeError:
        return None
    return body if isinstance(body, dict) else None


async def replay(relay: Relay, sample: Sample, order: ReplayOrder) -> tuple[int, bytes]:
    """Send the sample again, whole (not streamed), through the relay as `order` says: the
    status and body it answered."""
    payload = {k: v for k, v in sample.payload.items() if k not in ("stream", "stream_options")}
    body = orjson.dumps(payload)
    scope: Scope = {
        "type": "http",
        "method": "POST",
        "path": sample.path,
        "headers": [(b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 0),
        REPLAY: order,
    }  # fmt: skip
    given = False
    status, chunks = 0, []

    async def receive() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # no disconnect: the watcher waits until disarmed
        raise AssertionError("unreachable")

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await relay(scope, receive, send)
    return status, b"".join(chunks)
