"""One request sees one registry snapshot, even when a refresh replaces it mid-request."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from sqlalchemy.orm import sessionmaker

from gateway.accounting import Ledger
from gateway.apikeys import hash_key
from gateway.homes import ResponseHomes
from gateway.limits import Limiter
from gateway.metrics import GatewayMetrics
from gateway.registry import BackendView, KeyView, PolicyView, Registry, Snapshot
from gateway.relay.proxy import Relay
from gateway.relay.upstream import Upstream
from gateway.settings import Settings
from planner.cost import ThroughputCurve

SECRET = "sk-one-snapshot"
KEY = KeyView(7, "k", None, None, 10.0, "monthly", None)
COMPLETION_TOKENS = 1000
# $3.60 per GPU-hour at 1000 tokens/s on one GPU is $1 per million tokens.
USD_PER_MTOK = 1.0


@dataclass
class SlowBackend:
    """An OpenAI-ish backend on a real socket that answers only when released."""

    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).lower()
        length = int(head.split(b"content-length:")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        self.arrived.set()
        await self.release.wait()
        usage = {"prompt_tokens": 5, "completion_tokens": COMPLETION_TOKENS}
        body = orjson.dumps({"choices": [], "usage": usage})
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%b" % (len(body), body)
        )
        await writer.drain()
        writer.close()


@pytest.fixture
async def backend() -> AsyncIterator[tuple[SlowBackend, str]]:
    slow = SlowBackend()
    server = await asyncio.start_server(slow.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield slow, f"http://127.0.0.1:{port}"


def snapshot(url: str, usd_per_gpu_hour: float, *, with_key_and_model: bool) -> Snapshot:
    view = BackendView("b", url, "m", "plain", None, "A100", 1)
    return Snapshot(
        backends={"m": (view,)} if with_key_and_model else {},
        policies={"m": PolicyView("pinned", "plain")},
        keys={hash_key(SECRET): KEY} if with_key_and_model else {},
        prices={"A100": usd_per_gpu_hour},
        curves={("m", "plain", "A100"): ThroughputCurve((1.0,), (1000.0,))},
    )


async def call(relay: Relay, body: dict[str, Any]) -> tuple[int, bytes]:
    """One ASGI request to the relay; its status and body."""
    sent: list[dict[str, Any]] = []
    messages = [{"type": "http.request", "body": orjson.dumps(body), "more_body": False}]
    never = asyncio.Event()  # the client stays connected

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop()
        await never.wait()
        return {"type": "http.disconnect"}

    async def send(message: Any) -> None:
        sent.append(message)

    headers = [
        (b"content-type", b"application/json"),
        (b"authorization", f"Bearer {SECRET}".encode()),
    ]
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": headers}
    await relay(scope, receive, send)
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


async def test_a_refresh_mid_request_changes_neither_its_auth_nor_its_price(
    backend: tuple[SlowBackend, str],
) -> None:
    slow, url = backend
    settings = Settings(database_url="sqlite://", require_api_key=True)
    registry, metrics = Registry(sessionmaker(), refresh_s=60), GatewayMetrics()
    ledger = Ledger(sessionmaker(), metrics, batch_size=100, flush_interval_s=60, max_pending=100)
    limiter = Limiter(sessionmaker(), sync_s=60)  # no database: nothing is synced or written
    registry.snapshot = snapshot(url, 3.6, with_key_and_model=True)
    client = Upstream(settings)
    homes = ResponseHomes(sessionmaker(), settle_s=60)  # no Responses API call here
    relay = Relay(settings, registry, ledger, limiter, metrics, client, homes)
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    try:
        in_flight = asyncio.create_task(call(relay, chat))
        await asyncio.wait_for(slow.arrived.wait(), 10)
        # A refresh lands: the key is revoked, the model gone, the GPU twice the price.
        registry.snapshot = snapshot(url, 7.2, with_key_and_model=False)
        slow.release.set()
        status, _ = await asyncio.wait_for(in_flight, 10)
        assert status == 200
        cost_usd = COMPLETION_TOKENS * USD_PER_MTOK / 1e6  # priced as when it was admitted
        assert ledger.unwritten_usd_by_key() == pytest.approx({KEY.id: cost_usd})
        labels = {"model": "m", "method": "plain"}  # not "unknown": the model it was served as
        assert metrics.registry.get_sample_value("draftgate_cost_usd_total", labels) == (
            pytest.approx(cost_usd)
        )
        assert (await call(relay, chat))[0] == 401  # the next request sees the refresh
    finally:
        await client.aclose()
