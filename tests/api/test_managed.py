"""Switching a managed backend whose new server cannot start: nothing changes but the audit."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from backends.launcher import LocalServer
from gateway.app import create_app
from gateway.control.managed import ManagedBackends
from gateway.schemas.resources import BackendCreate
from gateway.settings import Settings
from tests.conftest import ADMIN_TOKEN

DFLASH = {"method": "dflash", "k": 7, "drafter": "acme/m-dflash"}
BROKEN_START = "import sys; print('cannot load the drafter: no such file'); sys.exit(3)"


def failing_launch(backend: BackendCreate, port: int, log_path: Path) -> LocalServer:
    """A real process that exits during start-up, as a server with a bad drafter does."""
    return LocalServer(backend.name, [sys.executable, "-c", BROKEN_START], port, log_path)


@pytest.fixture
async def managed_client(
    settings: Settings, tmp_path: Path
) -> AsyncIterator[tuple[httpx.AsyncClient, ManagedBackends]]:
    # The adopted server is never contacted on this path: a failed switch leaves it alone.
    adopted = LocalServer("sim-a", [sys.executable, "-c", "pass"], 1, tmp_path / "a.log")
    managed = ManagedBackends(failing_launch, tmp_path, [adopted])
    app = create_app(settings, managed)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        async with httpx.AsyncClient(
            transport=transport, base_url="http://gateway.test", headers=headers
        ) as http:
            yield http, managed


async def test_failed_start_is_audited_and_the_old_backend_keeps_serving(
    managed_client: tuple[httpx.AsyncClient, ManagedBackends],
) -> None:
    http, managed = managed_client
    backend = {
        "name": "sim-a",
        "url": "http://127.0.0.1:9",
        "model": "m",
        "method": "eagle3",
        "k": 3,
        "drafter": "acme/m-eagle3",
        "managed": True,
    }
    assert (await http.post("/admin/v1/backends", json=backend)).status_code == 201
    accepted = await http.post("/admin/v1/backends/sim-a/switch", json=DFLASH)
    assert accepted.status_code == 202, accepted.text
    assert accepted.json() == {
        "old_name": "sim-a",
        "new_name": "sim-a-dflash-k7",
        "method": "dflash",
        "k": 7,
        "status": "starting",
    }
    await managed.wait_idle()

    audit = (await http.get("/admin/v1/audit", params={"resource_type": "backend"})).json()
    failed = [e for e in audit["data"] if e["action"] == "switch-failed"]
    assert len(failed) == 1, audit
    assert failed[0]["resource_id"] == "sim-a"
    assert "cannot load the drafter" in failed[0]["after"]["error"]
    assert failed[0]["after"]["target"]["method"] == "dflash"
    old = (await http.get("/admin/v1/backends/sim-a")).json()
    assert (old["enabled"], old["method"], old["k"]) == (True, "eagle3", 3)
    assert (await http.get("/admin/v1/backends/sim-a-dflash-k7")).status_code == 404
    # The backend can be switched again: a failed switch does not leave it locked.
    again = await http.post("/admin/v1/backends/sim-a/switch", json=DFLASH)
    assert again.status_code == 202


async def test_switch_in_a_gateway_that_started_no_servers_is_refused(
    client: httpx.AsyncClient,
) -> None:
    backend = {"name": "ext", "url": "http://127.0.0.1:9", "model": "m", "method": "plain"}
    assert (await client.post("/admin/v1/backends", json=backend)).status_code == 201
    refused = await client.post("/admin/v1/backends/ext/switch", json={"method": "eagle3"})
    assert refused.status_code == 409
    assert refused.json()["error"]["message"] == (
        "backend 'ext' is not managed by this gateway process"
    )
