"""The webhook sender against a real receiver on a socket: signed bodies, retries on 5xx and
refused connections, none on other 4xx, and one dead receiver holding back no other."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator

import httpx
import pytest
from pydantic import SecretStr

from gateway.events.webhooks import Retry, WebhookSender, backend_mismatch, webhook_client
from gateway.metrics import GatewayMetrics
from gateway.registry import BackendView
from tests.e2e.conftest import closed_url
from tests.webhook_receiver import Receiver, running_receiver

SECRET = "whsec-0123456789abcdef-delivery"
DEADLINE_S = 30.0  # a deadline for a condition, never a wait
BACKEND = BackendView("sim-a", "http://sim-a", "m", "plain", None, "B200", 1)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with running_receiver(SECRET) as listening:
        yield listening


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    http = webhook_client(2, 5.0)
    try:
        yield http
    finally:
        await http.aclose()


class Running:
    """A sender whose workers run until the test ends."""

    def __init__(self, sender: WebhookSender, metrics: GatewayMetrics) -> None:
        self.sender, self.metrics = sender, metrics

    def count(self, outcome: str, event_type: str = "backend.mismatch") -> float:
        labels = {"type": event_type, "outcome": outcome}
        return self.metrics.registry.get_sample_value("draftgate_webhook_events_total", labels) or 0

    def retries(self, event_type: str = "backend.mismatch") -> float:
        labels = {"type": event_type}
        return (
            self.metrics.registry.get_sample_value("draftgate_webhook_retries_total", labels) or 0
        )


async def until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {DEADLINE_S} s")
        await asyncio.sleep(0.02)


@pytest.fixture
async def start(client: httpx.AsyncClient) -> AsyncIterator[Callable[..., Running]]:
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []

    def started(urls: list[str], attempts: int = 4, base_s: float = 0.02) -> Running:
        metrics = GatewayMetrics()
        sender = WebhookSender(
            urls, SecretStr(SECRET), client, metrics, queue_size=10, retry=Retry(attempts, base_s)
        )
        tasks.append(asyncio.create_task(sender.run(stop)))
        return Running(sender, metrics)

    try:
        yield started
    finally:
        stop.set()
        await asyncio.gather(*tasks)


async def test_an_event_arrives_signed_with_its_type_and_id(
    receiver: Receiver, start: Callable[..., Running]
) -> None:
    running = start([receiver.url])
    event = backend_mismatch(BACKEND, "declared plain but exposes spec-decode counters")
    running.sender.emit(event)
    await until(lambda: running.count("sent") == 1, "the event was not sent")
    [got] = receiver.received
    assert got.signed, got.headers
    assert got.path == "/hooks/draftgate"
    assert got.headers["content-type"] == "application/json"
    assert got.headers["x-draftgate-event"] == "backend.mismatch"
    assert got.headers["x-draftgate-event-id"] == event.id == got.event["id"]
    assert got.event["backend"] == "sim-a"
    assert got.event["data"] == {
        "method": "plain",
        "reason": "declared plain but exposes spec-decode counters",
    }
    assert got.event["replica"]  # the sending host's name


async def test_a_failing_receiver_gets_the_same_event_again_until_it_takes_it(
    receiver: Receiver, start: Callable[..., Running]
) -> None:
    receiver.fail(2, status=503)
    running = start([receiver.url])
    running.sender.emit(backend_mismatch(BACKEND, "why"))
    await until(lambda: running.count("sent") == 1, "the event was not sent on its third try")
    attempts = receiver.received
    assert [a.status for a in attempts] == [503, 503, 204]
    assert len({a.event["id"] for a in attempts}) == 1
    assert len({a.body for a in attempts}) == 1  # the same body; each attempt signed anew
    assert all(a.signed for a in attempts)
    assert running.retries() == 2
    assert running.count("failed") == 0


async def test_a_429_is_retried_and_another_4xx_is_not(
    receiver: Receiver, start: Callable[..., Running]
) -> None:
    receiver.fail(1, status=429)
    running = start([receiver.url])
    running.sender.emit(backend_mismatch(BACKEND, "first"))
    await until(lambda: running.count("sent") == 1, "the event after a 429 was not sent")
    receiver.fail(1, status=400)
    running.sender.emit(backend_mismatch(BACKEND, "second"))
    await until(lambda: running.count("failed") == 1, "the refused event was not counted")
    assert [a.status for a in receiver.received] == [429, 204, 400]  # 400: never again
    assert running.retries() == 1


async def test_attempts_are_bounded_then_the_event_counts_as_failed(
    receiver: Receiver, start: Callable[..., Running]
) -> None:
    receiver.fail(100, status=500)
    running = start([receiver.url], attempts=3)
    running.sender.emit(backend_mismatch(BACKEND, "why"))
    await until(lambda: running.count("failed") == 1, "the event did not fail")
    assert len(receiver.received) == 3
    assert running.retries() == 2


async def test_a_receiver_that_refuses_connections_is_retried(
    start: Callable[..., Running],
) -> None:
    running = start([closed_url()], attempts=3)
    running.sender.emit(backend_mismatch(BACKEND, "why"))
    await until(lambda: running.count("failed") == 1, "the event did not fail")
    assert running.retries() == 2


async def test_a_dead_receiver_holds_back_only_its_own_queue(
    receiver: Receiver, start: Callable[..., Running]
) -> None:
    # The dead URL's retries take seconds (8 attempts from 0.5 s, doubling); the live one's
    # delivery a moment. Both queues take every event at once, so the live one is served
    # while the dead one still retries its first.
    running = start([closed_url(), receiver.url], attempts=8, base_s=0.5)
    for reason in ("one", "two", "three"):
        running.sender.emit(backend_mismatch(BACKEND, reason))
    await until(lambda: running.count("sent") == 3, "the live receiver did not get all three")
    assert [e["data"]["reason"] for e in receiver.delivered()] == ["one", "two", "three"]
    assert running.count("failed") == 0  # the dead URL is still on its first event
    assert running.sender.queued >= 2
