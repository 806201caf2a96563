"""Security properties: every admin route behind the token, secrets compared in constant time,
stored only as hashes and never logged, no redirect followed, loopback defaults."""

from __future__ import annotations

import ast
import hashlib
import re
import secrets
import signal
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.routing import iter_route_contexts
from sqlalchemy import create_engine, inspect, text

import gateway
from gateway.app import create_app
from gateway.deps import SCOPE_FIELD
from gateway.settings import Settings
from tests.conftest import ADMIN_TOKEN, READ_TOKEN
from tests.e2e.conftest import (
    ServerStarter,
    draftgate_env,
    fleet_backend,
    sim_args,
    write_fleet,
)

# Routes anyone may call; every other route must be under /admin and refuse a bad token.
PUBLIC = {
    "/openapi.json",
    "/docs",
    "/docs/assets/{name}",  # Swagger UI's and ReDoc's own files (gateway/apidocs.py)
    "/redoc",
    "/health",
    "/ready",
    "/metrics",
    "/v1/models",
    "/v1/models/{model:path}",  # as /v1/models: a key when keys are required
    # a key when keys are required, and only the key's own stored response
    # (tests/e2e/test_responses_pool.py)
    "/v1/responses/{response_id}",
    "/v1/responses/{response_id}/cancel",
}
ENVELOPE_KEYS = {"message", "type", "param", "code"}


def every_route(app: FastAPI) -> list[tuple[str, str]]:
    """(method, path) of every route the app serves, included routers flattened."""
    routes = []
    for context in iter_route_contexts(app.routes):
        for method in sorted(context.methods or {"GET"}):
            if method != "HEAD":
                assert context.path is not None
                routes.append((method, context.path))
    return routes


def concrete(path: str) -> str:
    """A path template with each parameter filled in (`{name:path}` included)."""
    return re.sub(r"\{[^}]+\}", "1", path)


def test_the_route_walk_sees_every_admin_route() -> None:
    """Guards the walk itself: it must reach routes inside included routers."""
    routes = every_route(create_app(Settings(admin_token=ADMIN_TOKEN)))
    admin = [r for r in routes if r[1].startswith("/admin/")]
    assert ("POST", "/admin/v1/keys") in admin
    assert ("DELETE", "/admin/v1/backends/{name}") in admin
    assert len(admin) >= 30


def test_every_route_is_public_by_name_or_admin() -> None:
    routes = every_route(create_app(Settings(admin_token=ADMIN_TOKEN)))
    stray = [r for r in routes if r[1] not in PUBLIC and not r[1].startswith("/admin/v1/")]
    assert stray == []


BAD_AUTHORIZATIONS = {
    "missing": None,
    "empty": "",
    "wrong token": "Bearer wrong-token-0123456789abcdef",
    "last char changed": "Bearer " + ADMIN_TOKEN[:-1] + chr(ord(ADMIN_TOKEN[-1]) ^ 1),
    "prefix only": "Bearer " + ADMIN_TOKEN[:-1],
    "one char more": "Bearer " + ADMIN_TOKEN + "0",
    "other scheme": "Basic " + ADMIN_TOKEN,
    "no scheme": ADMIN_TOKEN,
}


async def test_every_admin_route_refuses_a_missing_or_wrong_token(app: FastAPI) -> None:
    transport = httpx.ASGITransport(app=app)
    admin_routes = [(m, p) for m, p in every_route(app) if p.startswith("/admin/")]
    assert len(admin_routes) >= 30
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway.test") as http:
        for case, authorization in BAD_AUTHORIZATIONS.items():
            headers = {} if authorization is None else {"Authorization": authorization}
            for method, path in admin_routes:
                # A malformed body too: FastAPI parses it before any dependency runs, and a
                # 422 before the 401 would let an anonymous caller map the routes.
                for content in (b"{}", b"{", b'{"k": 1e400}'):
                    response = await http.request(
                        method,
                        concrete(path),
                        headers=headers | {"content-type": "application/json"},
                        content=content,
                    )
                    assert response.status_code == 401, (case, method, path, response.text)
                    error = response.json()["error"]
                    assert set(error) == ENVELOPE_KEYS
                    assert error["type"] == "authentication_error"


async def test_the_right_token_is_accepted(client: httpx.AsyncClient) -> None:
    """The refusals above are about the token, not the routes: the real token passes."""
    assert (await client.get("/admin/v1/keys")).status_code == 200
    whoami = (await client.get("/admin/v1/whoami")).json()
    assert whoami == {"scope": "admin", "actor": "admin-api"}


def _read_only(app: FastAPI, method: str, path: str) -> bool:
    for context in iter_route_contexts(app.routes):
        if context.path == path and method in (context.methods or ()):
            return (context.openapi_extra or {}).get(SCOPE_FIELD) == "read"
    raise AssertionError((method, path))


async def test_the_read_token_reads_and_changes_nothing(app: FastAPI, database_url: str) -> None:
    """Every GET (and each route marked read-only) takes the read token; every other admin
    route refuses it with a 403, malformed body or not, and nothing is written."""
    routes = [(m, p) for m, p in every_route(app) if p.startswith("/admin/")]
    writes = [(m, p) for m, p in routes if m != "GET" and not _read_only(app, m, p)]
    assert ("POST", "/admin/v1/keys") in writes
    assert ("PUT", "/admin/v1/models/{name:path}/policy") in writes
    assert ("POST", "/admin/v1/methods/render") not in writes
    before = sorted(_all_cells(database_url))
    headers = {"Authorization": f"Bearer {READ_TOKEN}", "content-type": "application/json"}
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway.test") as http:
        for method, path in writes:
            for content in (b"{}", b"{", b'{"name": "x", "url": "http://127.0.0.1:1"}'):
                response = await http.request(
                    method, concrete(path), headers=headers, content=content
                )
                assert response.status_code == 403, (method, path, response.text)
                error = response.json()["error"]
                assert (error["type"], error["code"]) == ("permission_error", "insufficient_scope")
        for method, path in routes:
            if (method, path) not in writes:
                response = await http.request(
                    method, concrete(path), headers=headers, content=b"{}"
                )
                assert response.status_code not in (401, 403), (method, path, response.text)
        whoami = (await http.get("/admin/v1/whoami", headers=headers)).json()
        assert whoami == {"scope": "read", "actor": "admin-read"}
        render = {"model": "m", "method": "eagle3", "k": 3, "drafter": "d"}
        rendered = await http.post("/admin/v1/methods/render", headers=headers, json=render)
        assert rendered.status_code == 200, rendered.text
    assert sorted(_all_cells(database_url)) == before


def _functions_comparing_secrets(source: str) -> list[str]:
    """`==`/`!=` comparisons with a `get_secret_value()` call on either side."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Compare)
            and any(isinstance(op, ast.Eq | ast.NotEq) for op in node.ops)
            and "get_secret_value" in ast.unparse(node)
        ):
            found.append(ast.unparse(node))
    return found


def test_secrets_are_compared_in_constant_time_or_looked_up_by_hash() -> None:
    package = Path(gateway.__file__).parent
    sources = {p: p.read_text(encoding="utf-8") for p in package.rglob("*.py")}
    assert [(p.name, c) for p, s in sources.items() for c in _functions_comparing_secrets(s)] == []
    deps = sources[package / "deps.py"]
    assert "compare_digest(" in deps
    for key_side in ("relay/checks.py", "openai_routes.py"):  # keys: a dict lookup by SHA-256
        assert "hash_key(" in sources[package / key_side]


def _all_cells(database_url: str) -> list[str]:
    """Every value of every row of every table, as text."""
    engine = create_engine(database_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.connect() as conn:
            cells = []
            for table in inspect(conn).get_table_names():
                for row in conn.execute(text(f'SELECT * FROM "{table}"')):
                    cells.extend(str(value) for value in row)
            return cells
    finally:
        engine.dispose()


async def test_keys_are_stored_only_as_hashes(client: httpx.AsyncClient, database_url: str) -> None:
    created = await client.post("/admin/v1/keys", json={"name": "hashed"})
    assert created.status_code == 201, created.text
    secret: str = created.json()["key"]
    await client.patch(f"/admin/v1/keys/{created.json()['id']}", json={"name": "renamed"})
    listed = (await client.get("/admin/v1/keys")).text
    cells = _all_cells(database_url)
    assert hashlib.sha256(secret.encode()).hexdigest() in cells
    assert not [c for c in cells if secret in c]
    assert secret not in listed
    assert ADMIN_TOKEN not in "".join(cells)


def test_every_default_host_is_loopback() -> None:
    import importlib
    import inspect as pyinspect

    from dashboard.settings import DashboardSettings

    assert Settings.model_fields["host"].default == "127.0.0.1"  # gateway and `draftgate up`
    assert "127.0.0.1" in DashboardSettings.model_fields["dashboard_gateway_url"].default
    import pkgutil

    import gateway.cli

    hosts = {}
    for info in pkgutil.iter_modules(gateway.cli.__path__):  # every `draftgate` command's module
        name = info.name
        module = importlib.import_module(f"gateway.cli.{name}")
        for function in vars(module).values():
            if pyinspect.isfunction(function) and function.__module__ == module.__name__:
                for param in pyinspect.signature(function).parameters.values():
                    if "host" in param.name and param.default is not param.empty:
                        hosts[f"{name}.{function.__name__}({param.name})"] = param.default
    assert {"sim.sim(host)", "main.dashboard_command(host)"} <= set(hosts)
    assert {k: v for k, v in hosts.items() if v not in (None, "127.0.0.1")} == {}


# --- A backend that redirects: the gateway never follows. ---


class _Recorder(BaseHTTPRequestHandler):
    """Answers every request with `answer(handler)`; counts requests per server."""

    def do_GET(self) -> None:
        self.server.hits.append(self.path)  # type: ignore[attr-defined]
        self.server.answer(self)  # type: ignore[attr-defined]

    do_POST = do_GET

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _serve(answer: Any) -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    server.hits = []  # type: ignore[attr-defined]
    server.answer = answer  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def _ok(handler: BaseHTTPRequestHandler) -> None:
    body = b'{"status":"ok"}'
    handler.send_response(200)
    handler.send_header("content-type", "application/json")
    handler.send_header("content-length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


@pytest.fixture
def target() -> Iterator[ThreadingHTTPServer]:
    """Where the redirect points: it must never be asked anything."""
    yield from _serve(_ok)


@pytest.fixture
def redirecting(target: ThreadingHTTPServer) -> Iterator[ThreadingHTTPServer]:
    """A backend whose /health is fine but which answers every /v1 call with a 307."""
    location = f"http://127.0.0.1:{target.server_address[1]}/v1/chat/completions"

    def answer(handler: BaseHTTPRequestHandler) -> None:
        if handler.path == "/health":
            _ok(handler)
            return
        handler.rfile.read(int(handler.headers.get("content-length", 0)))
        handler.send_response(307)
        handler.send_header("location", location)
        handler.send_header("content-length", "0")
        handler.end_headers()

    yield from _serve(answer)


def test_a_backend_redirect_is_not_followed(
    start_server: ServerStarter,
    tmp_path: Path,
    redirecting: ThreadingHTTPServer,
    target: ThreadingHTTPServer,
) -> None:
    url = f"http://127.0.0.1:{redirecting.server_address[1]}"
    fleet = write_fleet(tmp_path / "fleet.yaml", [fleet_backend("redirecting", url)])
    env = draftgate_env(
        DRAFTGATE_ADMIN_TOKEN=ADMIN_TOKEN,
        DRAFTGATE_DATABASE_URL=f"sqlite:///{tmp_path}/db.sqlite",
        DRAFTGATE_FLEET=str(fleet),
        DRAFTGATE_REQUIRE_API_KEY="false",
        DRAFTGATE_BREAKER_FAILURES="100",  # both requests reach the backend
    )
    server = start_server("gateway", env=env)
    for stream in (False, True):
        body = {
            "model": "openai/gpt-oss-20b",
            "messages": [{"role": "user", "content": "hi"}],
            "stream": stream,
            "max_tokens": 4,
        }
        with server.client() as http:
            response = http.post("/v1/chat/completions", json=body)
        assert response.status_code == 502, response.text
        assert response.json()["error"]["code"] == "upstream_error"
        assert "location" not in response.headers
    assert len([h for h in redirecting.hits if h.startswith("/v1/")]) >= 2
    assert target.hits == []


# --- No secret in logs. ---


def last_char_changed(secret: str) -> str:
    """`secret` with a different last character."""
    return secret[:-1] + ("A" if secret[-1] != "A" else "B")


def test_no_secret_appears_in_the_logs(start_server: ServerStarter, tmp_path: Path) -> None:
    token = secrets.token_urlsafe(32)
    sim = start_server(*sim_args("--time-scale", "50"), env=draftgate_env())
    fleet = write_fleet(tmp_path / "fleet.yaml", [fleet_backend("sim", sim.base_url)])
    env = draftgate_env(
        DRAFTGATE_ADMIN_TOKEN=token,
        DRAFTGATE_DATABASE_URL=f"sqlite:///{tmp_path}/db.sqlite",
        DRAFTGATE_FLEET=str(fleet),
        DRAFTGATE_REQUIRE_API_KEY="true",
        DRAFTGATE_LOG_LEVEL="debug",
        DRAFTGATE_REGISTRY_REFRESH_S="0.2",
    )
    gateway = start_server("gateway", env=env)
    with gateway.client(token) as admin:
        created = admin.post("/admin/v1/keys", json={"name": "logged?"})
        assert created.status_code == 201, created.text
        key: str = created.json()["key"]
        assert admin.get("/admin/v1/keys").status_code == 200
        assert admin.patch(f"/admin/v1/keys/{created.json()['id']}", json={"name": "x"}).is_success
    near_misses = [last_char_changed(token), last_char_changed(key), token + key]
    chat = {
        "model": "openai/gpt-oss-20b",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
    }
    with gateway.client(key) as client:
        assert client.post("/v1/chat/completions", json=chat).status_code == 200
        assert client.post("/v1/chat/completions", json=chat | {"stream": True}).status_code == 200
        assert client.get("/v1/models").status_code == 200
        assert client.get("/admin/v1/keys").status_code == 401  # a key is no admin token
    for wrong in near_misses:
        with gateway.client(wrong) as client:
            assert client.get("/admin/v1/keys").status_code == 401
            assert client.post("/v1/chat/completions", json=chat).status_code == 401
    with gateway.client(token) as admin:  # an admin call that fails inside, with the token
        assert admin.post("/admin/v1/keys", json={"name": 5}).status_code == 422
    assert gateway.stop(signal.SIGTERM) == 0
    logs = gateway.output() + "".join(
        p.read_text(errors="replace") for p in tmp_path.rglob("*.log") if p != gateway.log_path
    )
    assert "DEBUG" in logs  # debug logging was on: the most a deployment could log
    for secret in (token, key, token[:16], key[:20]):
        assert secret not in logs


# --- Request size limits beyond /v1 (the relay's own are in test_hostile_requests). ---


@pytest.mark.parametrize("chunked", [False, True])
async def test_an_admin_body_beyond_max_body_bytes_is_413(database_url: str, chunked: bool) -> None:
    settings = Settings(database_url=database_url, admin_token=ADMIN_TOKEN, max_body_bytes=4096)
    application = create_app(settings)
    oversized = b'{"name": "' + b"a" * 8192 + b'"}'

    async def in_pieces() -> Any:
        for start in range(0, len(oversized), 1000):
            yield oversized[start : start + 1000]

    async with application.router.lifespan_context(application):
        transport = httpx.ASGITransport(app=application)
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}", "content-type": "application/json"}
        async with httpx.AsyncClient(
            transport=transport, base_url="http://gw", headers=headers
        ) as c:
            content = in_pieces() if chunked else oversized
            response = await c.post("/admin/v1/keys", content=content)
            assert response.status_code == 413, response.text
            assert set(response.json()["error"]) == ENVELOPE_KEYS
            assert response.headers["connection"] == "close"  # the rest is never read
            assert (await c.get("/admin/v1/keys")).json()["data"] == []  # nothing was created
            fitting = await c.post("/admin/v1/keys", json={"name": "a" * 100})
            assert fitting.status_code == 201


# --- The dashboard never shows the admin token. ---


def _dashboard_page(module_name: str) -> None:
    import importlib

    importlib.import_module(f"dashboard.app_pages.{module_name}").render()  # type: ignore[attr-defined]


def dashboard_pages() -> list[str]:
    """Every module of dashboard/app_pages with a `render` (so a new page cannot escape)."""
    import importlib
    import pkgutil

    from dashboard import app_pages

    names = [m.name for m in pkgutil.iter_modules(app_pages.__path__)]
    return [
        n for n in names if hasattr(importlib.import_module(f"{app_pages.__name__}.{n}"), "render")
    ]


def test_no_dashboard_page_shows_the_admin_token(
    start_server: ServerStarter, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from streamlit.testing.v1 import AppTest

    token = secrets.token_urlsafe(32)
    sim = start_server(*sim_args("--time-scale", "50"), env=draftgate_env())
    fleet = write_fleet(tmp_path / "fleet.yaml", [fleet_backend("sim", sim.base_url)])
    env = draftgate_env(
        DRAFTGATE_ADMIN_TOKEN=token,
        DRAFTGATE_DATABASE_URL=f"sqlite:///{tmp_path}/db.sqlite",
        DRAFTGATE_FLEET=str(fleet),
        DRAFTGATE_REQUIRE_API_KEY="false",
    )
    gateway = start_server("gateway", env=env)
    with gateway.client(token) as admin:
        assert admin.post("/admin/v1/keys", json={"name": "shown once"}).status_code == 201
    monkeypatch.setenv("DRAFTGATE_DASHBOARD_GATEWAY_URL", gateway.base_url)
    monkeypatch.setenv("DRAFTGATE_ADMIN_TOKEN", token)
    pages = dashboard_pages()
    assert {"overview", "keys", "backends"} <= set(pages)
    for name in pages:
        at = AppTest.from_function(_dashboard_page, args=(name,), default_timeout=60).run()
        assert not at.exception, (name, at.exception)
        rendered = repr(at.main) + repr(at.sidebar) + repr(at.get("text_input"))
        assert at.main.children, name  # the page drew something
        assert token not in rendered, name
        assert token[:12] not in rendered, name
