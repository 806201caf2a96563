"""The dashboard's door: Streamlit's app, as an ASGI app, behind a Host allow-list, an
Origin check on its WebSocket and anti-framing headers. `draftgate dashboard` serves it.

Streamlit alone accepts any `Host`, so a page on another origin can reach a dashboard on
loopback by DNS rebinding (its name re-pointed at 127.0.0.1, same origin in the browser's
eyes) and drive it with whatever token the dashboard holds. Here a request whose `Host` is
not listed gets a 403, and so does a WebSocket opened from a page whose `Origin` is not
listed; answers carry headers that stop other sites from framing the pages (clickjacking).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import streamlit as st
from starlette.middleware import Middleware

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

SCRIPT = Path(__file__).parent / "streamlit_app.py"
HEALTH_PATH = "/_stcore/health"  # probes (the kubelet's carry the pod's IP as Host) pass
# Streamlit's own options for the served dashboard: headless, no usage statistics, a viewer's
# toolbar (no deploy button, no developer menu), no file watching, XSRF and CORS checks on.
STREAMLIT_OPTIONS: dict[str, object] = {
    "server_headless": True,
    "browser_gatherUsageStats": False,
    "server_fileWatcherType": "none",
    "client_toolbarMode": "viewer",
    "server_enableXsrfProtection": True,
    "server_enableCORS": True,
}
# Same-origin framing stays allowed: Streamlit shows components in iframes of its own.
SECURITY_HEADERS = [
    (b"x-frame-options", b"SAMEORIGIN"),
    (b"content-security-policy", b"frame-ancestors 'self'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
]
REFUSED = b"host not allowed: add it to DRAFTGATE_DASHBOARD_ALLOWED_HOSTS"
# Streamlit serves the default page at `/` only; its own name, linked to, would be a
# "Page not found".
DEFAULT_PAGE_PATH = "/overview"


def host_allowed(host: str | None, allowed: Sequence[str]) -> bool:
    """Whether `host` (a Host header or an Origin's netloc, port ignored) is in `allowed`:
    exact names, `*.example.com` for any subdomain, `*` for any host."""
    if not host:
        return False
    try:
        parts = urlsplit(f"//{host}")
        name, _ = parts.hostname, parts.port  # .port checks the port is a number
    except ValueError:
        return False
    if not name or parts.username is not None or parts.path or parts.query:
        return False
    for entry in allowed:
        if entry == "*" or name == entry or (entry.startswith("*.") and name.endswith(entry[1:])):
            return True
    return False


class Door:
    """ASGI middleware: the Host and Origin checks and the headers above."""

    def __init__(self, app: ASGIApp, allowed_hosts: Sequence[str]) -> None:
        self.app, self.allowed = app, [h.strip().lower() for h in allowed_hosts if h.strip()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        hosts = [v.decode("latin-1") for n, v in scope["headers"] if n == b"host"]
        allowed = scope["path"] == HEALTH_PATH or (
            len(hosts) == 1 and host_allowed(hosts[0], self.allowed)  # two: which is meant?
        )
        origins = [v.decode("latin-1") for n, v in scope["headers"] if n == b"origin"]
        if kind == "websocket" and origins:
            allowed = allowed and all(
                host_allowed(urlsplit(o).netloc, self.allowed) for o in origins
            )
        if not allowed:
            await _refuse(kind, send)
            return
        if kind == "websocket":
            await self.app(scope, receive, send)
            return
        if scope["path"].rstrip("/") == DEFAULT_PAGE_PATH:
            await _redirect_home(scope, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, send_with_headers)


async def _redirect_home(scope: Scope, send: Send) -> None:
    query = scope.get("query_string", b"")
    location = b"/" + (b"?" + query if query else b"")
    headers = [(b"location", location), (b"content-length", b"0"), *SECURITY_HEADERS]
    await send({"type": "http.response.start", "status": 308, "headers": headers})
    await send({"type": "http.response.body", "body": b""})


async def _refuse(kind: str, send: Send) -> None:
    if kind == "websocket":  # closing before accepting: the server answers the upgrade 403
        await send({"type": "websocket.close", "code": 1008})
        return
    headers = [(b"content-type", b"text/plain"), (b"content-length", b"%d" % len(REFUSED))]
    await send({"type": "http.response.start", "status": 403, "headers": headers})
    await send({"type": "http.response.body", "body": REFUSED})


def dashboard_app(allowed_hosts: Sequence[str]) -> st.App:
    """The dashboard as an ASGI app behind the door (Streamlit's options loaded first)."""
    from streamlit.web import bootstrap

    bootstrap.load_config_options(STREAMLIT_OPTIONS | {"server_allowedHosts": list(allowed_hosts)})
    return st.App(SCRIPT, middleware=[Middleware(Door, allowed_hosts=allowed_hosts)])
