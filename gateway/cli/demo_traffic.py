"""Demo traffic for `draftgate up --demo-traffic`: a gentle load whose concurrency rises and falls.

Streaming chat requests go through the gateway like any client's, so the ledger, savings,
collector and the auto policy all see real traffic within the first minute. The number of
clients follows a raised cosine between `low` and `high` over `period_s`: low load (where
parallel drafters win) and high load (where the planner may prefer another method) both
come round every period.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from dataclasses import dataclass

import httpx

PROMPTS = (
    "Explain speculative decoding in two sentences.",
    "Write a Python function that merges two sorted lists.",
    "What is 17 times 23? Show the steps.",
    "Summarise the benefits of batching for GPU inference.",
)


@dataclass(frozen=True)
class DemoLoad:
    """The shape of the demo load."""

    model: str
    low: int = 1
    high: int = 24
    period_s: float = 120.0
    max_tokens: int = 64

    def clients_at(self, elapsed_s: float) -> int:
        """How many clients send at `elapsed_s` into the run (pure)."""
        phase = (1 - math.cos(2 * math.pi * elapsed_s / self.period_s)) / 2  # 0 → 1 → 0
        return self.low + round(phase * (self.high - self.low))


async def _client(http: httpx.AsyncClient, load: DemoLoad, n: int, active: asyncio.Event) -> None:
    """One client: streams a request, then another, while it is among the active ones."""
    i = n
    while True:
        await active.wait()
        body = {
            "model": load.model,
            "max_tokens": load.max_tokens,
            "stream": True,
            "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
        }
        i += 1
        if not await _send(http, body):
            await asyncio.sleep(1.0)  # the gateway is not up yet, or refused: back off


async def _send(http: httpx.AsyncClient, body: dict[str, object]) -> bool:
    """Stream one request to its end; whether it succeeded."""
    try:
        async with http.stream("POST", "/v1/chat/completions", json=body) as response:
            async for _ in response.aiter_bytes():
                pass
    except httpx.HTTPError:
        return False
    return response.status_code < 400


async def run(
    base_url: str, load: DemoLoad, stop: threading.Event, api_key: str | None = None
) -> None:
    """Drive the load until `stop`, adjusting the active clients every second."""
    limits = httpx.Limits(max_connections=load.high + 2)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    async with httpx.AsyncClient(
        base_url=base_url, timeout=120.0, limits=limits, headers=headers
    ) as http:
        gates = [asyncio.Event() for _ in range(load.high)]
        clients = [asyncio.create_task(_client(http, load, n, g)) for n, g in enumerate(gates)]
        start = time.monotonic()
        try:
            while not stop.is_set():
                active = load.clients_at(time.monotonic() - start)
                for n, gate in enumerate(gates):
                    if n < active:
                        gate.set()
                    else:
                        gate.clear()
                await asyncio.sleep(1.0)
        finally:
            for task in clients:
                task.cancel()
            await asyncio.gather(*clients, return_exceptions=True)


def start_in_thread(
    base_url: str, load: DemoLoad, api_key: str | None = None
) -> tuple[threading.Thread, threading.Event]:
    """Run the demo load in a daemon thread of its own; set the event to stop it."""
    stop = threading.Event()
    thread = threading.Thread(
        target=asyncio.run,
        args=(run(base_url, load, stop, api_key),),
        name="demo-traffic",
        daemon=True,
    )
    thread.start()
    return thread, stop
