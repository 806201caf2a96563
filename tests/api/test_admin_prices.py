"""Admin API for GPU prices."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.api.test_admin_backends import assert_envelope

B200 = {
    "gpu_type": "B200",
    "usd_per_gpu_hour": 6.25,
    "kind": "on-demand",
    "source": "https://example.com/pricing",
    "date": "2026-11-01",
}


async def test_price_lifecycle(client: httpx.AsyncClient) -> None:
    created = await client.post("/admin/v1/prices", json=B200)
    assert created.status_code == 201, created.text
    price = created.json()
    assert {k: price[k] for k in B200} == B200
    reserved = {**B200, "kind": "reserved", "usd_per_gpu_hour": 3.9}
    assert (await client.post("/admin/v1/prices", json=reserved)).status_code == 201

    patched = await client.patch(f"/admin/v1/prices/{price['id']}", json={"usd_per_gpu_hour": 5.5})
    assert patched.json()["usd_per_gpu_hour"] == 5.5
    assert patched.json()["source"] == B200["source"]

    listed = (await client.get("/admin/v1/prices", params={"gpu_type": "B200"})).json()["data"]
    assert [(p["kind"], p["usd_per_gpu_hour"]) for p in listed] == [
        ("on-demand", 5.5),
        ("reserved", 3.9),
    ]
    assert (await client.delete(f"/admin/v1/prices/{price['id']}")).status_code == 204
    assert_envelope(await client.get(f"/admin/v1/prices/{price['id']}"), 404)

    audit = (await client.get("/admin/v1/audit", params={"resource_type": "gpu_price"})).json()
    actions = [(e["action"], e["resource_id"]) for e in audit["data"]]
    assert actions == [
        ("delete", "B200/on-demand"),
        ("update", "B200/on-demand"),
        ("create", "B200/reserved"),
        ("create", "B200/on-demand"),
    ]


async def test_same_gpu_and_kind_is_409(client: httpx.AsyncClient) -> None:
    await client.post("/admin/v1/prices", json=B200)
    assert_envelope(await client.post("/admin/v1/prices", json={**B200, "source": "x"}), 409)


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"usd_per_gpu_hour": -1}, "usd_per_gpu_hour"),
        ({"kind": "preemptible"}, "kind"),
        ({"date": "last tuesday"}, "date"),
        ({"source": ""}, "source"),
        ({"gpu_type": ""}, "gpu_type"),
    ],
)
async def test_invalid_price_is_422(
    client: httpx.AsyncClient, change: dict[str, Any], param: str
) -> None:
    assert_envelope(await client.post("/admin/v1/prices", json={**B200, **change}), 422, param)


async def test_patch_cannot_make_a_price_negative(client: httpx.AsyncClient) -> None:
    price = (await client.post("/admin/v1/prices", json=B200)).json()
    response = await client.patch(f"/admin/v1/prices/{price['id']}", json={"usd_per_gpu_hour": -2})
    assert_envelope(response, 422, "usd_per_gpu_hour")
    assert_envelope(await client.patch("/admin/v1/prices/abc", json={}), 422, "price_id")
