"""Admin API for pools, in process, on SQLite and PostgreSQL."""

from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI

from gateway.db.session import transaction
from gateway.errors import ValidationFailed
from gateway.schemas.resources import PoolCreate
from gateway.services import pools
from tests.api.test_admin_backends import assert_envelope

POOL = {
    "discovery": {"dns": "vllm-eagle3.serving.invalid", "port": 8000},
    "backend": {
        "model": "Qwen/Qwen3-8B",
        "method": "eagle3",
        "k": 3,
        "drafter": "RedHatAI/Qwen3-8B-speculator.eagle3",
        "gpu_type": "H100",
        "api_key": "sk-backend-secret",
    },
}


def _add_members(app: FastAPI, *addresses: str) -> None:
    """What discovery does when the addresses answer (tested end to end in
    tests/e2e/test_pools.py)."""
    with transaction(app.state.components.sessions) as session:
        pool = PoolCreate.model_validate({"name": "eagle3", **POOL})
        for address in addresses:
            pools.add_member(session, pool, address, "discovery", allow_link_local=False)


async def test_a_pool_is_put_read_changed_with_its_members_and_deleted(
    client: httpx.AsyncClient, app: FastAPI
) -> None:
    created = await client.put("/admin/v1/pools/eagle3", json=POOL)
    assert created.status_code == 200, created.text
    shown = created.json()
    assert shown["discovery"] == {
        "dns": "vllm-eagle3.serving.invalid",
        "port": 8000,
        "scheme": "http",
    }
    assert shown["backend"]["has_api_key"] is True
    assert "sk-backend-secret" not in created.text
    assert shown["members"] == []
    _add_members(app, "10.0.0.5", "fd00::5")
    members = (await client.get("/admin/v1/pools/eagle3")).json()["members"]
    assert members == ["eagle3:10.0.0.5:8000", "eagle3:fd00::5:8000"]
    backend = (await client.get("/admin/v1/backends/eagle3:fd00::5:8000")).json()
    assert (backend["url"], backend["pool"], backend["k"]) == ("http://[fd00::5]:8000", "eagle3", 3)
    # a changed template changes every member at once
    changed = {**POOL, "backend": {**POOL["backend"], "k": 5}}
    assert (await client.put("/admin/v1/pools/eagle3", json=changed)).status_code == 200
    backend = (await client.get("/admin/v1/backends/eagle3:10.0.0.5:8000")).json()
    assert backend["k"] == 5
    assert [p["name"] for p in (await client.get("/admin/v1/pools")).json()["data"]] == ["eagle3"]
    assert (await client.delete("/admin/v1/pools/eagle3")).status_code == 204
    assert_envelope(await client.get("/admin/v1/pools/eagle3"), 404)
    listed = (await client.get("/admin/v1/backends")).json()["data"]
    assert [b for b in listed if b["pool"] == "eagle3"] == []
    audit = (await client.get("/admin/v1/audit", params={"resource_type": "pool"})).json()["data"]
    assert [e["action"] for e in audit] == ["delete", "update", "create"]
    assert "sk-backend-secret" not in str(audit)


async def test_a_pool_found_through_the_kubernetes_api_is_kept_as_declared(
    client: httpx.AsyncClient,
) -> None:
    in_cluster = {**POOL, "discovery": {"service": "vllm-eagle3", "namespace": "serving"}}
    shown = (await client.put("/admin/v1/pools/eagle3", json=in_cluster)).json()
    assert shown["discovery"] == {
        "service": "vllm-eagle3",
        "namespace": "serving",
        "port": 8000,
        "scheme": "http",
    }
    # the same pool moved to DNS: the Service is forgotten, and back again
    assert (await client.put("/admin/v1/pools/eagle3", json=POOL)).json()["discovery"] == {
        "dns": "vllm-eagle3.serving.invalid",
        "port": 8000,
        "scheme": "http",
    }
    own_namespace = {**POOL, "discovery": {"service": "vllm-eagle3", "port": 8001}}
    shown = (await client.put("/admin/v1/pools/eagle3", json=own_namespace)).json()
    assert shown["discovery"]["namespace"] is None
    assert (await client.get("/admin/v1/pools/eagle3")).json()["discovery"]["port"] == 8001


async def test_bad_pools_are_clean_errors(client: httpx.AsyncClient) -> None:
    bad_dns = {**POOL, "discovery": {"dns": "not a name"}}
    assert_envelope(await client.put("/admin/v1/pools/p", json=bad_dns), 422)
    both = {**POOL, "discovery": {"dns": "vllm.test", "service": "vllm"}}
    assert_envelope(await client.put("/admin/v1/pools/p", json=both), 422)
    bad_service = {**POOL, "discovery": {"service": "Vllm_Plain"}}
    assert_envelope(await client.put("/admin/v1/pools/p", json=bad_service), 422)
    no_drafter = {**POOL, "backend": {"model": "m", "method": "eagle3", "k": 3}}
    assert_envelope(await client.put("/admin/v1/pools/p", json=no_drafter), 422)
    assert_envelope(await client.put("/admin/v1/pools/-p", json=POOL), 422)
    assert_envelope(await client.delete("/admin/v1/pools/nope"), 404)
    unknown = {**POOL, "members": ["x"]}
    assert_envelope(await client.put("/admin/v1/pools/p", json=unknown), 422)


async def test_a_link_local_address_never_becomes_a_member(app: FastAPI) -> None:
    with pytest.raises(ValidationFailed, match="link-local"):
        _add_members(app, "169.254.169.254")
