"""Liveness, readiness and audit paging."""

from __future__ import annotations

import httpx

from tests.api.test_admin_backends import assert_envelope


async def test_health_needs_no_token(client: httpx.AsyncClient) -> None:
    response = await client.get("/health", headers={"Authorization": ""})
    assert response.json() == {"status": "ok"}


async def test_ready_needs_a_healthy_backend(client: httpx.AsyncClient) -> None:
    # With a real backend it turns ready: tests/e2e/test_gateway_relay.py.
    assert "no healthy backend (0 enabled)" in assert_envelope(await client.get("/ready"), 503)


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
