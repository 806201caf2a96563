"""A TCP relay with an outage switch: the database as the gateway sees it can blink.

The PostgreSQL server is shared, so it is never stopped; the gateway reaches it through this
relay instead, and `cut()` makes the database vanish for it: existing connections are reset
and new ones are accepted and closed at once (or, with `silent=True`, accepted and never
answered), until `restore()`.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from dataclasses import dataclass, field

BUFFER_BYTES = 65536


@dataclass
class TcpRelay:
    """Forward 127.0.0.1:`port` to `target_host`:`target_port` in threads."""

    target_host: str
    target_port: int
    port: int = 0
    refused: int = 0  # connections turned away during outages
    _listener: socket.socket = field(init=False, repr=False)
    _down: threading.Event = field(default_factory=threading.Event)
    _closed: threading.Event = field(default_factory=threading.Event)
    _open: set[socket.socket] = field(default_factory=set)
    _held: list[socket.socket] = field(default_factory=list)  # silent outage: never answered
    _silent: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> TcpRelay:
        """Listen on a free loopback port and start accepting."""
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", self.port))
        self._listener.listen(128)
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept_forever, daemon=True).start()
        return self

    def url_for(self, database_url: str) -> str:
        """`database_url` with its host and port replaced by this relay's."""
        origin = f"{self.target_host}:{self.target_port}"
        if origin not in database_url:
            raise ValueError(f"{database_url} does not name {origin}")
        return database_url.replace(origin, f"127.0.0.1:{self.port}", 1)

    def cut(self, *, silent: bool = False) -> None:
        """Start an outage: reset every open connection and refuse new ones.

        `silent`: accept new connections but never answer on them (a host that stopped
        answering), until `restore()` closes them.
        """
        self._silent = silent
        self._down.set()
        with self._lock:
            sockets, self._open = list(self._open), set()
        for sock in sockets:
            _reset(sock)

    def restore(self) -> None:
        """End the outage."""
        self._down.clear()
        with self._lock:
            held, self._held = self._held, []
        for sock in held:
            _reset(sock)

    @property
    def connections(self) -> int:
        """Sockets open through the relay now (both sides counted)."""
        with self._lock:
            return len(self._open)

    def close(self) -> None:
        """Stop listening and drop every connection."""
        self._closed.set()
        self.cut()
        with contextlib.suppress(OSError):
            self._listener.close()

    def _accept_forever(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._down.is_set():
                self.refused += 1
                if self._silent:
                    with self._lock:
                        self._held.append(client)
                else:
                    _reset(client)
                continue
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection((self.target_host, self.target_port), timeout=5)
        except OSError:
            _reset(client)
            return
        upstream.settimeout(None)
        with self._lock:
            self._open.update((client, upstream))
        threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()
        self._pump(upstream, client)

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(BUFFER_BYTES):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._open.discard(source)
                self._open.discard(sink)
            _reset(source)
            _reset(sink)


def _reset(sock: socket.socket) -> None:
    """Close a socket at once (shut down first: that wakes a thread blocked reading it)."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
