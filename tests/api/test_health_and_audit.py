"""Liveness, readiness and audit paging."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx

from gateway.control.readiness import check_ready, publish_readiness
from gateway.db import migrate
from gateway.db.session import make_engine, make_sessionmaker
from gateway.metrics import GatewayMetrics
from gateway.registry import BackendView, Registry, Snapshot
from tests.api.test_admin_backends import assert_envelope


async def test_health_needs_no_token(client: httpx.AsyncClient) -> None:
    response = await client.get("/health", headers={"Authorization": ""})
    assert response.json() == {"status": "ok"}


async def test_ready_needs_a_healthy_backend(client: httpx.AsyncClient) -> None:
    # With a real backend it turns ready: tests/e2e/test_gateway_relay.py.
    assert "no healthy backend (0 enabled)" in assert_envelope(await client.get("/ready"), 503)


async def test_the_ready_gauge_follows_the_readiness_check(
    database_url: str, tmp_path: Path
) -> None:
    """`draftgate_ready` is 1 while the database answers and a backend is healthy, 0 when
    either fails, as GET /ready would say."""
    engine = make_engine(database_url)
    migrate.upgrade(engine)
    sessions = make_sessionmaker(engine)
    registry = Registry(sessions, refresh_s=60)
    backend = BackendView("a", "http://a", "m", "plain", None, "B200", 1)
    registry.snapshot = Snapshot(backends={"m": (backend,)})
    metrics, stop = GatewayMetrics(), asyncio.Event()
    loop = asyncio.create_task(publish_readiness(sessions, registry, metrics.ready, 0.01, stop))

    async def gauge_becomes(value: float) -> None:
        deadline = time.monotonic() + 10
        while metrics.registry.get_sample_value("draftgate_ready") != value:
            assert time.monotonic() < deadline, f"draftgate_ready never became {value}"
            await asyncio.sleep(0.01)

    try:
        await gauge_becomes(1)
        registry.states["a"].healthy = False
        await gauge_becomes(0)
        assert check_ready(sessions, registry).problem == "no healthy backend (1 enabled)"
        registry.states["a"].healthy = True
        await gauge_becomes(1)
    finally:
        stop.set()
        await loop
        engine.dispose()
    gone = make_engine(f"sqlite:///{tmp_path}/missing/draftgate.db")  # its folder does not exist
    try:
        readiness = check_ready(make_sessionmaker(gone), registry)
        assert readiness.problem == "database unreachable: OperationalError"
    finally:
        gone.dispose()


async def test_audit_pages_newest_first(client: httpx.AsyncClient) -> None:
    for n in range(5):
        await client.post("/admin/v1/models", json={"name": f"m{n}"})
    first = (await client.get("/admin/v1/audit", params={"limit": 2})).json()["data"]
    assert [e["resource_id"] for e in first] == ["m4", "m3"]
    rest = await client.get("/admin/v1/audit", params={"limit": 10, "before_id": first[-1]["id"]})
    assert [e["resource_id"] for e in rest.json()["data"]] == ["m2", "m1", "m0"]
    one = await client.get("/admin/v1/audit", params={"resource_id": "m1"})
    assert [e["resource_id"] for e in one.json()["data"]] == ["m1"]
    assert_envelope(await client.get("/admin/v1/audit", params={"limit": 0}), 422, "limit")


async def test_openapi_lists_the_admin_resources(client: httpx.AsyncClient) -> None:
    paths = (await client.get("/openapi.json")).json()["paths"]
    for resource in ("backends", "models", "prices", "keys", "audit"):
        assert f"/admin/v1/{resource}" in paths
    assert "/admin/v1/models/{name}/policy" in paths
