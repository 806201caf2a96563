"""The dashboard's door, on a real `draftgate dashboard` process: only listed hosts are
answered (DNS rebinding), a WebSocket from a foreign page is refused, no other site may
frame the pages, a trickled request is cut, and a WebSocket outlives that cut-off."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from dashboard.server import host_allowed
from tests.dashboard.conftest import wait_for_dashboard
from tests.e2e.conftest import READ_TOKEN, Server, closed_url, draftgate_env, spawn_server

READ_TIMEOUT_S = 1.0
HOSTS = "localhost,127.0.0.1,dashboard.example.com,*.corp.example"


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    env = draftgate_env(
        DRAFTGATE_DASHBOARD_GATEWAY_URL=closed_url(),
        DRAFTGATE_ADMIN_READ_TOKEN=READ_TOKEN,
        DRAFTGATE_DASHBOARD_ALLOWED_HOSTS=HOSTS,
        DRAFTGATE_DASHBOARD_READ_TIMEOUT_S=str(READ_TIMEOUT_S),
    )
    server = spawn_server(("dashboard",), env, tmp_path_factory.mktemp("door"))
    try:
        wait_for_dashboard(server.base_url, server)
        yield server
    finally:
        server.close()


def _get(server: Server, path: str, host: str) -> httpx.Response:
    return httpx.get(f"{server.base_url}{path}", headers={"Host": host}, timeout=10.0)


@pytest.mark.parametrize(
    "host", ["localhost", "127.0.0.1:8501", "dashboard.example.com", "a.b.corp.example"]
)
def test_listed_hosts_get_the_page_with_anti_framing_headers(dashboard: Server, host: str) -> None:
    page = _get(dashboard, "/", host)
    assert page.status_code == 200
    assert "<html" in page.text.lower()
    assert page.headers["x-frame-options"] == "SAMEORIGIN"
    assert page.headers["content-security-policy"] == "frame-ancestors 'self'"
    assert page.headers["x-content-type-options"] == "nosniff"


def test_the_default_page_s_own_address_leads_to_it(dashboard: Server) -> None:
    for path, location in (("/overview", "/"), ("/overview/?tab=1", "/?tab=1")):
        answer = _get(dashboard, path, "localhost")
        assert (answer.status_code, answer.headers["location"]) == (308, location)
        assert answer.headers["x-frame-options"] == "SAMEORIGIN"
    assert _get(dashboard, "/overview", "attacker.example").status_code == 403


@pytest.mark.parametrize(
    "host", ["attacker.example", "dashboard.example.com.attacker.example", "corp.example", ""]
)
def test_any_other_host_is_refused_except_for_the_health_probe(
    dashboard: Server, host: str
) -> None:
    for path in ("/", "/_stcore/host-config", "/static/index.html"):
        refused = _get(dashboard, path, host)
        assert refused.status_code == 403, (path, refused.text)
        assert "DRAFTGATE_DASHBOARD_ALLOWED_HOSTS" in refused.text
    assert _get(dashboard, "/_stcore/health", host).status_code == 200  # kubelet probes


async def _open(server: Server, host: str, origin: str | None) -> str:
    """Open the dashboard's WebSocket as a browser at `host` would, from a page at `origin`."""
    url = f"ws://{host}:{server.port}/_stcore/stream"
    headers = {} if origin is None else {"Origin": origin.format(port=server.port)}
    try:
        async with connect(
            url, host="127.0.0.1", port=server.port, origin=None, additional_headers=headers,
            subprotocols=["streamlit"],  # type: ignore[list-item]
        ):  # fmt: skip
            return "open"
    except InvalidStatus as exc:
        return str(exc.response.status_code)


@pytest.mark.parametrize(
    ("host", "origin", "outcome"),
    [
        ("127.0.0.1", None, "open"),
        ("127.0.0.1", "http://127.0.0.1:{port}", "open"),
        ("localhost", "http://localhost:{port}", "open"),
        # behind a login proxy that passes the browser's Host on
        ("dashboard.example.com", "https://dashboard.example.com:{port}", "open"),
        ("127.0.0.1", "http://attacker.example", "403"),  # a foreign page's script
        ("attacker.example", None, "403"),
        ("attacker.example", "http://attacker.example", "403"),  # DNS rebinding
    ],
)
async def test_the_websocket_opens_only_from_listed_hosts_and_origins(
    dashboard: Server, host: str, origin: str | None, outcome: str
) -> None:
    assert await _open(dashboard, host, origin) == outcome


def test_a_second_host_header_is_refused(dashboard: Server) -> None:
    """Servers differ in which of two Host headers they read: refuse the request instead."""
    with socket.create_connection(("127.0.0.1", dashboard.port), timeout=30) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\nHost: attacker.example\r\n\r\n")
        answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 403"), answer


def test_a_trickled_request_is_cut_with_a_408(dashboard: Server) -> None:
    with socket.create_connection(("127.0.0.1", dashboard.port), timeout=30) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\n")  # and never the blank line
        started = time.monotonic()
        answer = sock.recv(4096)
        waited = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert waited < READ_TIMEOUT_S + 20  # cut by the server, long before the socket timeout


async def test_a_websocket_outlives_the_read_timeout(dashboard: Server) -> None:
    """The read deadline covers a request's arrival, not an upgraded connection's life."""
    url = f"ws://127.0.0.1:{dashboard.port}/_stcore/stream"
    async with connect(url, subprotocols=["streamlit"]) as ws:  # type: ignore[list-item]
        await asyncio.sleep(3 * READ_TIMEOUT_S)  # what must not happen: no condition to await
        pong = await ws.ping()
        await asyncio.wait_for(pong, timeout=10.0)


def test_host_matching() -> None:
    allowed = ["localhost", "::1", "*.corp.example"]
    assert host_allowed("localhost:8501", allowed)
    assert host_allowed("[::1]:8501", allowed)
    assert host_allowed("LOCALHOST", allowed)
    assert host_allowed("x.corp.example", allowed)
    assert not host_allowed("corp.example", allowed)
    assert not host_allowed("xcorp.example", allowed)
    assert not host_allowed("localhost.attacker.example", allowed)
    assert not host_allowed("user@localhost", allowed)
    assert not host_allowed("localhost:notaport", allowed)
    assert not host_allowed(None, allowed)
    assert host_allowed("anything", ["*"])
