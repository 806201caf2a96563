"""Webhooks: JSON events POSTed to the configured URLs, signed, retried, never on the hot path.

The control loops call `WebhookSender.emit` with an event; it never blocks and never raises
into its caller (from any thread). Each URL has a bounded queue of its own and one worker
that delivers its events one at a time, in order, so a slow or dead receiver holds only its
own queue; when a queue is full the oldest event is dropped (the newest says how things are
now) and counted. A delivery is retried with exponential backoff and jitter on connection
errors, timeouts, 5xx and 429, never on another 4xx, up to `webhook_max_attempts` in all.
Every body is signed: `x-draftgate-signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of
"<t>.<body>" under the webhook secret>` (docs/webhooks.md has a receiver's check).
"""

# Over 400 lines: the events and their signed, retried delivery: one contract with receivers.

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import hmac
import logging
import random
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol
from urllib.parse import urlsplit

import httpx
from pydantic import BaseModel, SecretStr

from gateway.metrics import GatewayMetrics
from gateway.registry import BackendView, KeyView, Snapshot
from gateway.settings import Settings

logger = logging.getLogger(__name__)
SIGNATURE_HEADER = "x-draftgate-signature"
BACKOFF_MAX_S = 60.0  # the longest wait between two attempts
JITTER = 0.5  # a wait is between (1 - JITTER) and 1 times its exponential step
SHUTDOWN_GRACE_S = 2.0  # at shutdown, queued events get this long to go out
# A worker that takes over as its replica's leader sends the events it saw this long before
# (more than the leader lock's poll), so none seen in the hand-over is lost.
HANDOVER_S = 2.0
HELD_EVENTS = 256  # the most a worker that does not lead keeps for a hand-over
EventType = Literal[
    "method.moved",
    "method.quarantined",
    "budget.threshold",
    "team.budget.threshold",
    "backend.down",
    "backend.up",
    "backend.mismatch",
]


class Candidate(BaseModel):
    """One method the selector priced for a move."""

    method: str
    usd_per_mtok: float
    itl_ms: float | None = None  # per-token latency (docs/costs.md)
    curve_source: str | None = None  # measured / estimated at that load


class MethodMoved(BaseModel):
    """`method.moved`: the selector moved an auto model (or one of its classes)."""

    request_class: str | None  # None: the model's own choice
    objective: str
    before: str | None
    after: str
    concurrency: float
    candidates: list[Candidate]  # cheapest first


class BudgetSpend(BaseModel):
    """A budget's spend in its period, past one of the fractions watched."""

    budget_usd: float
    budget_period: str
    period_start: dt.datetime | None  # None: a `total` budget
    spent_usd: float
    fraction: float
    threshold: float


class BudgetThreshold(BudgetSpend):
    """`budget.threshold`: a key's spend in its period reached a fraction of its budget."""

    key_id: int
    key_name: str


class TeamBudgetThreshold(BudgetSpend):
    """`team.budget.threshold`: what a team's keys spent in its period reached a fraction of
    the team's budget (docs/teams.md)."""

    team_id: int
    team_name: str


class BackendHealth(BaseModel):
    """`backend.down` / `backend.up`: this replica's health probes changed their mind."""

    method: str
    probe: str  # healthy, down (refused or not 200) or slow (timed out twice running)


class BackendMismatch(BaseModel):
    """`backend.mismatch`: a backend's counters contradict its declared method."""

    method: str
    reason: str


class MethodQuarantined(BaseModel):
    """The lossless watchdog took a method out of a model's `auto` choices (docs/lossless.md):
    the evidence it saw, as the audit log records it."""

    method: str
    quarantine_id: int
    evidence: dict[str, object]


class WebhookEvent(BaseModel):
    """One event as every receiver gets it (the JSON body)."""

    type: EventType
    id: str  # the same on every attempt; see docs/webhooks.md for what else repeats it
    time: dt.datetime
    replica: str = ""  # the host name of the gateway that sent it
    model: str | None = None
    backend: str | None = None
    data: (
        MethodMoved
        | MethodQuarantined
        | BudgetThreshold
        | TeamBudgetThreshold
        | BackendHealth
        | BackendMismatch
    )


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _new_id() -> str:
    return uuid.uuid4().hex


def stable_id(*parts: object) -> str:
    """An event id made of what the event is about: the same wherever it is computed."""
    return hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:32]


class MoveDecision(Protocol):
    """What the selector decided (gateway/control/selector.py `Decision`)."""

    @property
    def model(self) -> str: ...
    @property
    def before(self) -> str | None: ...
    @property
    def after(self) -> str: ...
    @property
    def concurrency(self) -> float: ...
    @property
    def usd_per_mtok(self) -> Mapping[str, float]: ...
    @property
    def itl_ms(self) -> Mapping[str, float]: ...
    @property
    def request_class(self) -> str | None: ...
    @property
    def objective(self) -> str: ...


def method_moved(decision: MoveDecision, snapshot: Snapshot) -> WebhookEvent:
    """The event of an automatic move, with every candidate's price and curve source."""
    candidates = [
        Candidate(
            method=method,
            usd_per_mtok=round(usd, 6),
            itl_ms=None if (itl := decision.itl_ms.get(method)) is None else round(itl, 3),
            curve_source=_curve_source(snapshot, decision.model, method, decision.concurrency),
        )
        for method, usd in sorted(decision.usd_per_mtok.items(), key=lambda item: item[1])
    ]
    data = MethodMoved(
        request_class=decision.request_class,
        objective=decision.objective,
        before=decision.before,
        after=decision.after,
        concurrency=round(decision.concurrency, 2),
        candidates=candidates,
    )
    return WebhookEvent(
        type="method.moved", id=_new_id(), time=_now(), model=decision.model, data=data
    )


def method_quarantined(
    model: str, method: str, quarantine_id: int, evidence: dict[str, object]
) -> WebhookEvent:
    """The event of a quarantine, with the evidence behind it."""
    data = MethodQuarantined(method=method, quarantine_id=quarantine_id, evidence=evidence)
    return WebhookEvent(
        type="method.quarantined", id=_new_id(), time=_now(), model=model, data=data
    )


def _curve_source(snapshot: Snapshot, model: str, method: str, load: float) -> str | None:
    """Whether the method's curve is measured or estimated at the load its backends share,
    on the GPU type that prices it cheapest (as the selector priced it)."""
    backends = [b for b in snapshot.backends.get(model, ()) if b.method == method]
    c = max(load / max(len(backends), 1), 1.0)
    priced = [(snapshot.usd_per_mtok(model, method, b, c), b.gpu_type) for b in backends]
    known = [(usd, gpu_type) for usd, gpu_type in priced if usd is not None]
    if not known:
        return None
    return snapshot.curve_source(model, method, min(known)[1], c)


def backend_health(backend: BackendView, healthy: bool, probe: str) -> WebhookEvent:
    """`backend.up` or `backend.down` for a backend this replica's prober judged anew."""
    return WebhookEvent(
        type="backend.up" if healthy else "backend.down",
        id=_new_id(),
        time=_now(),
        model=backend.model,
        backend=backend.name,
        data=BackendHealth(method=backend.method, probe=probe),
    )


def backend_mismatch(backend: BackendView, reason: str) -> WebhookEvent:
    """`backend.mismatch` for a backend whose scraped counters contradict its method."""
    return WebhookEvent(
        type="backend.mismatch",
        id=_new_id(),
        time=_now(),
        model=backend.model,
        backend=backend.name,
        data=BackendMismatch(method=backend.method, reason=reason),
    )


def budget_threshold(
    key: KeyView, period_start: dt.datetime | None, spent_usd: float, threshold: float
) -> WebhookEvent:
    """`budget.threshold` for a key (`team.budget.threshold` for a team: a subject below 0);
    its id is the same on every replica for one crossing."""
    budget = key.budget_usd or 0.0
    start = "total" if period_start is None else period_start.isoformat()
    if key.id < 0:  # a team, as the limiter counts it (registry.team_subject)
        team = TeamBudgetThreshold(
            team_id=-key.id, team_name=key.name, budget_usd=budget,
            budget_period=key.budget_period, period_start=period_start, spent_usd=spent_usd,
            fraction=round(spent_usd / budget, 6) if budget else 0.0, threshold=threshold,
        )  # fmt: skip
        event_id = stable_id("team.budget.threshold", -key.id, start, budget, threshold)
        return WebhookEvent(type="team.budget.threshold", id=event_id, time=_now(), data=team)
    data = BudgetThreshold(
        key_id=key.id,
        key_name=key.name,
        budget_usd=budget,
        budget_period=key.budget_period,
        period_start=period_start,
        spent_usd=spent_usd,
        fraction=round(spent_usd / budget, 6) if budget else 0.0,
        threshold=threshold,
    )
    event_id = stable_id("budget.threshold", key.id, start, budget, threshold)
    return WebhookEvent(type="budget.threshold", id=event_id, time=_now(), data=data)


def sign(secret: bytes, body: bytes, timestamp: int) -> str:
    """The signature header's value for `body` sent at `timestamp` (unix seconds)."""
    digest = hmac.new(secret, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


def backoff_s(retry: int, base_s: float, jitter: float, max_s: float = BACKOFF_MAX_S) -> float:
    """Seconds before retry number `retry` (1: the first): `base_s` doubled each time, at
    most `max_s`, scaled by (1 - JITTER + JITTER * jitter) with `jitter` in [0, 1)."""
    step = min(max_s, base_s * 2.0 ** (retry - 1))
    return step * (1 - JITTER + JITTER * jitter)


def retryable(status: int) -> bool:
    """Whether an answer with this status is worth another attempt."""
    return status == 429 or status >= 500


def _retry_after_s(response: httpx.Response) -> float | None:
    """A receiver's `Retry-After` in seconds, when it gives one as a number."""
    try:
        return float(response.headers["retry-after"])
    except (KeyError, ValueError):
        return None


def safe_url(url: str) -> str:
    """What of a URL may be logged: scheme, host and port (its path may hold a token)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}" + (f":{parts.port}" if parts.port else "")


@dataclass(frozen=True, slots=True)
class _Pending:
    """An event ready to go: its type and id, and its body as sent."""

    type: str
    id: str
    body: bytes


@dataclass(frozen=True)
class Retry:
    """How hard one delivery is tried."""

    max_attempts: int
    base_s: float


class _Destination:
    """One URL, its queue and its worker."""

    def __init__(self, url: str, queue_size: int) -> None:
        self.url, self.label = url, safe_url(url)
        self.queue: asyncio.Queue[_Pending] = asyncio.Queue(queue_size)
        self.worker: asyncio.Task[None] | None = None


class WebhookSender:
    """Queues events per URL and delivers them; create it on the event loop it serves."""

    def __init__(
        self,
        urls: Sequence[str],
        secret: SecretStr | None,
        client: httpx.AsyncClient,
        metrics: GatewayMetrics,
        *,
        queue_size: int,
        retry: Retry,
        replica: str | None = None,
        jitter: Callable[[], float] = random.random,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client, self.metrics, self.retry, self.jitter = client, metrics, retry, jitter
        self._clock = clock
        self._held: deque[tuple[float, WebhookEvent]] = deque(maxlen=HELD_EVENTS)
        self._secret = None if secret is None else secret.get_secret_value().encode()
        self.replica = socket.gethostname() if replica is None else replica
        self._destinations = [_Destination(url, queue_size) for url in urls]
        self.leading = (
            True  # off in a worker process that does not lead (gateway/server/replica.py)
        )
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()
        metrics.webhook_queued.set_function(lambda: self.queued)

    @classmethod
    def of(cls, settings: Settings, metrics: GatewayMetrics) -> WebhookSender | None:
        """The sender the settings ask for, with a client of its own; None without URLs."""
        urls = settings.webhook_url_list
        if not urls:
            return None
        if settings.webhook_secret is None:
            logger.warning("webhooks are sent unsigned: no DRAFTGATE_WEBHOOK_SECRET (dev mode)")
        retry = Retry(settings.webhook_max_attempts, settings.webhook_backoff_s)
        client = webhook_client(len(urls), settings.webhook_timeout_s)
        return cls(
            urls,
            settings.webhook_secret,
            client,
            metrics,
            queue_size=settings.webhook_queue_size,
            retry=retry,
        )

    def emit(self, event: WebhookEvent) -> None:
        """Queue `event` for every URL: never blocks, never raises (safe from any thread).
        A worker that does not lead its replica sends nothing (the leader sends the same): it
        holds the event for `HANDOVER_S`, in case it leads next."""
        if not self.leading:
            self._held.append((self._clock(), event))
            return
        try:
            stamped = event.model_copy(update={"replica": event.replica or self.replica})
            pending = _Pending(event.type, event.id, stamped.model_dump_json().encode())
            if threading.get_ident() == self._thread:
                self._enqueue(pending)
            else:
                self._loop.call_soon_threadsafe(self._enqueue, pending)
        except Exception:  # the top of every caller's webhook path: a loop must go on
            logger.exception("webhook event %s not queued", event.type)

    def lead(self) -> None:
        """This worker now leads its replica: send from now on, and send what it saw in the
        last `HANDOVER_S` (the old leader may have died before it could; a receiver
        deduplicates what both sent, as it does across replicas)."""
        self.leading = True
        recent = self._clock() - HANDOVER_S
        held, self._held = list(self._held), deque(maxlen=HELD_EVENTS)
        for seen, event in held:
            if seen >= recent:
                self.emit(event)

    def _enqueue(self, pending: _Pending) -> None:
        for destination in self._destinations:
            if destination.queue.full():
                dropped = destination.queue.get_nowait()
                destination.queue.task_done()
                self.metrics.webhook_events.labels(dropped.type, "dropped").inc()
                logger.warning(
                    "webhook queue of %s full: dropped %s event %s",
                    destination.label,
                    dropped.type,
                    dropped.id,
                )
            destination.queue.put_nowait(pending)

    @property
    def queued(self) -> int:
        """Events waiting, over every URL."""
        return sum(d.queue.qsize() for d in self._destinations)

    async def run(self, stop: asyncio.Event) -> None:
        """Deliver until `stop`; then give what is queued `SHUTDOWN_GRACE_S` to go out."""
        for destination in self._destinations:
            destination.worker = asyncio.create_task(self._work(destination))
        try:
            await stop.wait()
            waiting = [d.queue.join() for d in self._destinations]
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*waiting), SHUTDOWN_GRACE_S)
        finally:
            workers = [d.worker for d in self._destinations if d.worker is not None]
            for worker in workers:
                worker.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            if self.queued:
                logger.warning("shutdown with %d webhook events undelivered", self.queued)

    async def aclose(self) -> None:
        """Close the client."""
        await self.client.aclose()

    async def _work(self, destination: _Destination) -> None:
        """Deliver one URL's events in order, one at a time, for ever."""
        while True:
            pending = await destination.queue.get()
            try:
                outcome = await self._deliver(destination.url, pending)
            except Exception:  # the worker's top: one event's surprise never ends the rest
                logger.exception("webhook %s event %s failed", pending.type, pending.id)
                outcome = "failed"
            finally:
                destination.queue.task_done()
            self.metrics.webhook_events.labels(pending.type, outcome).inc()

    async def _deliver(self, url: str, pending: _Pending) -> str:
        """POST one event to one URL, retrying as configured: `sent` or `failed`."""
        why, attempt = "", 0
        while attempt < self.retry.max_attempts:
            attempt += 1
            if attempt > 1:
                self.metrics.webhook_retries.labels(pending.type).inc()
            retry_after_s = None
            try:
                status, retry_after_s = await self._post(url, pending)
            except httpx.HTTPError as exc:  # connect errors, timeouts, a dropped connection
                why = type(exc).__name__
            else:
                if 200 <= status < 300:
                    return "sent"
                why = f"HTTP {status}"
                if not retryable(status):
                    break
            if attempt < self.retry.max_attempts:
                wait = backoff_s(attempt, self.retry.base_s, self.jitter())
                await asyncio.sleep(min(max(wait, retry_after_s or 0.0), BACKOFF_MAX_S))
        logger.warning(
            "webhook %s event %s to %s failed after %d attempts: %s",
            pending.type,
            pending.id,
            safe_url(url),
            attempt,
            why,
        )
        return "failed"

    async def _post(self, url: str, pending: _Pending) -> tuple[int, float | None]:
        """One attempt: the answer's status and `Retry-After` (its body is never read)."""
        headers = {
            "content-type": "application/json",
            "user-agent": "draftgate-webhooks",
            "x-draftgate-event": pending.type,
            "x-draftgate-event-id": pending.id,
        }
        if self._secret is not None:  # signed at each attempt: the timestamp stays fresh
            headers[SIGNATURE_HEADER] = sign(self._secret, pending.body, int(time.time()))
        request = self.client.build_request("POST", url, content=pending.body, headers=headers)
        response = await self.client.send(request, stream=True)
        await response.aclose()
        return response.status_code, _retry_after_s(response)


def webhook_client(urls: int, timeout_s: float) -> httpx.AsyncClient:
    """The webhooks' own client: a small pool (each URL sends one event at a time) and
    short timeouts, so no receiver can take what the relay or the probes need."""
    limits = httpx.Limits(max_connections=urls, max_keepalive_connections=urls)
    timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, 3.0))
    # trust_env off, like every other client of the gateway: no environment proxy is used.
    return httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False)
