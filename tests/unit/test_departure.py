"""A request is cancelled when its client leaves mid-attempt: told by the server protocol
through the scope, or, under another ASGI server, by the disconnect message."""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.relay.departure import Departure
from gateway.relay.exchange import Exchange
from gateway.server.http_limits import LOST, ON_DISCONNECT


async def _attempt(departure: Departure, started: asyncio.Event) -> str:
    departure.arm()
    try:
        started.set()
        await asyncio.Event().wait()  # a backend that never answers
    except asyncio.CancelledError:
        return "cancelled"
    finally:
        departure.disarm()
    return "finished"


async def _never() -> dict[str, Any]:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


async def test_the_protocols_hook_cancels_the_attempt_and_is_removed_after() -> None:
    scope: dict[str, Any] = {ON_DISCONNECT: None}
    departure, started = Departure(scope, _never, Exchange("r1")), asyncio.Event()
    task = asyncio.ensure_future(_attempt(departure, started))
    await started.wait()
    hook = scope[ON_DISCONNECT]
    assert callable(hook)
    hook()  # what the protocol does when the connection is lost
    assert await task == "cancelled"
    assert departure.happened
    assert scope[ON_DISCONNECT] is None  # a later attempt on a reused scope is not ours


async def test_a_client_gone_before_the_attempt_cancels_it_at_once() -> None:
    scope: dict[str, Any] = {ON_DISCONNECT: LOST}
    departure, started = Departure(scope, _never, Exchange("r2")), asyncio.Event()
    assert await _attempt(departure, started) == "cancelled"
    assert departure.happened


async def test_under_another_server_the_disconnect_message_cancels_it() -> None:
    messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    departure, started = Departure({}, messages.get, Exchange("r3")), asyncio.Event()
    task = asyncio.ensure_future(_attempt(departure, started))
    await started.wait()
    await messages.put({"type": "http.request", "body": b"", "more_body": False})
    await messages.put({"type": "http.disconnect"})
    assert await task == "cancelled"
    assert departure.happened


async def test_an_answered_request_is_not_cancelled_by_its_client_leaving() -> None:
    scope: dict[str, Any] = {ON_DISCONNECT: None}
    exchange = Exchange("r4")
    departure, started = Departure(scope, _never, exchange), asyncio.Event()
    task = asyncio.ensure_future(_attempt(departure, started))
    await started.wait()
    exchange.responded = True
    scope[ON_DISCONNECT]()
    assert departure.happened
    for _ in range(3):  # turns of the loop: a cancel would have landed in the first
        await asyncio.sleep(0)
    assert not task.done()
    task.cancel()  # the test's own end of the attempt
    assert await task == "cancelled"
