"""Watching for a client that leaves while a backend serves its request."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from gateway.relay.asgi import Receive, Scope
from gateway.relay.exchange import Exchange
from gateway.server.http_limits import LOST, ON_DISCONNECT


class Departure:
    """Cancels a request's task when its client disconnects while a backend serves it.

    Under the gateway's own server protocol (gateway/server/http_limits.py) the lost connection
    calls `left` through the scope; under another ASGI server (a test's in-process
    transport) a task waits on `receive` for the disconnect instead. Between attempts it
    holds neither the task nor its hook, so a finished request leaves no reference cycle
    for the garbage collector to find (its full passes pause the event loop)."""

    __slots__ = ("_hook", "_receive", "_scope", "_task", "_watcher", "_x", "happened")

    def __init__(self, scope: Scope, receive: Receive, exchange: Exchange) -> None:
        self._scope, self._receive, self._x = scope, receive, exchange
        self._task: asyncio.Task[Any] | None = None
        self._watcher: asyncio.Future[None] | None = None
        self._hook: Callable[[], None] | None = None
        self.happened = False

    def arm(self) -> None:
        """Watch from now on (an attempt has begun)."""
        self._task = asyncio.current_task()
        hook = self._scope.get(ON_DISCONNECT, self)
        if hook is self:  # not our server: wait for the disconnect message
            self._watcher = asyncio.ensure_future(self._wait())
        elif hook == LOST:  # it left before this attempt began
            self.left()
        else:
            self._hook = self._scope[ON_DISCONNECT] = self.left

    def disarm(self) -> None:
        """Stop watching (the attempt is over)."""
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None
        elif self._hook is not None and self._scope.get(ON_DISCONNECT) is self._hook:
            self._scope[ON_DISCONNECT] = None
        self._hook = self._task = None

    def left(self) -> None:
        """The client disconnected: cancel the request unless it was already answered."""
        self.happened = True
        if self._task is not None and not self._x.responded:
            self._task.cancel()

    async def _wait(self) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            pass
        self.left()
