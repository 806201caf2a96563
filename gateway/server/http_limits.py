"""The server side of HTTP: uvicorn's httptools protocol with limits on reading a request
and on writing the answer.

uvicorn bounds neither the size nor the count of request headers under httptools, nor the
time a client may take to send a request: a client trickling bytes (slowloris) holds its
connection for ever. Here each request must arrive whole within `read_timeout_s` of its first
byte (or of the connection opening), its head within `max_header_bytes` and `max_header_count`;
otherwise the client gets a 408/431 in the OpenAI error envelope and the connection closes.
Malformed requests get the envelope too instead of uvicorn's plain-text 400.

Nor does uvicorn time out writes: a client that stops reading a stream blocks the response's
next write for ever, and with it the upstream connection the relay is reading from. Here a
connection whose write buffer stays full (asyncio paused writing, at 64 KiB beyond what the
kernel holds) for `write_timeout_s` is aborted: the app sees a disconnect, as if the client
had left, and the scope says why (`STALLED`), so the relay records the request as stalled.
The kernel's own send buffer is bounded per connection (`send_buffer_bytes`): left to grow
(to megabytes on loopback), it let a reader that read nothing be sent 10,957 tokens over
25 s of a real-speed stream before the timeout even started; bounded, 659 tokens, and the
buffers are full within a second or two of the client's last read, so the timeout counts
from about then (tests/reliability/test_stalled_readers.py).

A disconnect is also told straight to the app: a callable it puts in the scope under
`ON_DISCONNECT` is called when the connection is lost. The relay cancels a request whose
client left that way, without a task per request waiting on `receive` for the disconnect.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.errors import error_body

logger = logging.getLogger(__name__)
REASONS = {400: b"Bad Request", 408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


@dataclass(frozen=True)
class RequestLimits:
    """How large a request head may be and how long a whole request may take to arrive."""

    max_header_bytes: int
    max_header_count: int
    read_timeout_s: float
    write_timeout_s: float
    send_buffer_bytes: int | None = None  # SO_SNDBUF per connection (None: the kernel's own)


STALLED = "draftgate.client_stalled"  # set in a request's scope when its client was cut
# In every request's scope: None, or what the app wants called when its client disconnects
# (the relay's cancel, with no task per request waiting on `receive`); LOST once it has.
ON_DISCONNECT = "draftgate.on_disconnect"
LOST = "lost"


class _Refused(Exception):
    """Raised inside a parser callback to stop parsing a request that broke a limit."""


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """httptools' protocol enforcing `limits` (set on the subclass `protocol_with` makes)."""

    limits: ClassVar[RequestLimits]

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._head_bytes = self._head_size = self._header_count = 0  # bytes read, bytes parsed
        self._refusal: tuple[int, str] | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._write_deadline: asyncio.TimerHandle | None = None
        if self.limits.send_buffer_bytes is not None:
            sock = transport.get_extra_info("socket")
            with contextlib.suppress(OSError, AttributeError):  # not a TCP socket
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.limits.send_buffer_bytes)
        super().connection_made(transport)
        self._arm()  # a connection that never sends a byte is closed too

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._resumed()
        super().connection_lost(exc)
        if self.cycle is not None:
            scope = cast(dict[str, Any], self.cycle.scope)
            hook, scope[ON_DISCONNECT] = scope.get(ON_DISCONNECT), LOST
            if callable(hook):
                hook()

    def pause_writing(self) -> None:
        """The client is not reading what we write: it has `write_timeout_s` to start again."""
        if self._write_deadline is None:
            timeout = self.limits.write_timeout_s
            self._write_deadline = self.loop.call_later(timeout, self._write_timed_out)
        super().pause_writing()

    def resume_writing(self) -> None:
        self._resumed()
        super().resume_writing()

    def _resumed(self) -> None:
        if self._write_deadline is not None:
            self._write_deadline.cancel()
            self._write_deadline = None

    def _write_timed_out(self) -> None:
        self._write_deadline = None
        if self.cycle is not None:
            cast(dict[str, Any], self.cycle.scope)[STALLED] = True
        logger.warning(
            "cut a client that read nothing for %s s (DRAFTGATE_CLIENT_WRITE_TIMEOUT_S)",
            self.limits.write_timeout_s,
        )
        self.transport.abort()  # close() would wait to flush what the client will not read

    def data_received(self, data: bytes) -> None:
        in_head = self._header_count >= 0
        if in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        if in_head and self._header_count >= 0 and self._head_bytes > self.limits.max_header_bytes:
            self._refuse(431, "request headers too large")

    def on_message_begin(self) -> None:
        if self._deadline is None:  # a request's first byte: it has read_timeout_s to arrive
            self._arm()
        super().on_message_begin()
        cast(dict[str, Any], self.scope)[ON_DISCONNECT] = None  # the app may set its hook

    def on_url(self, url: bytes) -> None:
        self._head_size += len(url)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        """Count the headers and their bytes (a whole head may come in one read)."""
        self._header_count += 1
        self._head_size += len(name) + len(value) + 4
        if self._header_count > self.limits.max_header_count:
            self._refusal = (431, f"more than {self.limits.max_header_count} request headers")
            raise _Refused
        if self._head_size > self.limits.max_header_bytes:
            self._refusal = (431, "request headers too large")
            raise _Refused
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._header_count = -1  # the head is done: bytes from here on are the body
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._disarm()
        if self.cycle is None or self.cycle.response_complete:
            self._await_next_head()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        self._disarm()
        if self.cycle is not None and self.cycle.more_body:  # answered early (a 401, say):
            self._arm()  # the unread rest of the body still has to arrive in time
        else:
            self._await_next_head()
        super().on_response_complete()

    def handle_websocket_upgrade(self) -> None:
        """The connection becomes a WebSocket (the dashboard's): its timers stop here, or
        they would close the socket the WebSocket protocol now owns."""
        self._disarm()
        self._resumed()
        super().handle_websocket_upgrade()

    def _await_next_head(self) -> None:
        self._head_bytes = self._head_size = self._header_count = 0

    def send_400_response(self, msg: str) -> None:
        status, message = self._refusal or (400, "malformed HTTP request")
        self._respond(status, message)

    def _arm(self) -> None:
        self._deadline = self.loop.call_later(self.limits.read_timeout_s, self._timed_out)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _timed_out(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self._header_count >= 0 and self._head_bytes:  # a head has begun: say why
            self._refuse(408, f"request not received within {self.limits.read_timeout_s} s")
        else:  # idle (an answer could race a new request), or the app sees a disconnect
            logger.debug("closing an idle connection or one whose request body stalled")
            self.transport.close()

    def _refuse(self, status: int, message: str) -> None:
        self._refusal = (status, message)
        self._respond(status, message)

    def _respond(self, status: int, message: str) -> None:
        if self.transport.is_closing():
            return
        logger.debug("refused a request: %s %s", status, message)
        body = orjson.dumps(error_body(message, "invalid_request_error", None, None))
        head = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\n" % (status, REASONS[status])
        head += b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body)
        self.transport.write(head + body)
        self.transport.close()


def protocol_with(limits: RequestLimits) -> type[LimitedHttpToolsProtocol]:
    """The protocol class to hand uvicorn (`http=`), bound to `limits`."""
    attributes: dict[str, Any] = {"limits": limits}
    return type("GatewayHttpProtocol", (LimitedHttpToolsProtocol,), attributes)
