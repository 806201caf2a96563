"""Admin API for API keys: shown once, stored hashed."""

from __future__ import annotations

import hashlib

import httpx
from fastapi import FastAPI
from sqlalchemy import create_engine, text

from gateway.settings import Settings
from tests.api.test_admin_backends import assert_envelope


async def test_key_is_shown_once_and_stored_hashed(
    client: httpx.AsyncClient, settings: Settings
) -> None:
    created = await client.post("/admin/v1/keys", json={"name": "team-a", "budget_usd": 100})
    assert created.status_code == 201, created.text
    key = created.json()["key"]
    assert key.startswith("dg-")
    assert len(key) > 40
    assert created.json()["key_prefix"] == key[:10]

    read = (await client.get(f"/admin/v1/keys/{created.json()['id']}")).text
    listed = (await client.get("/admin/v1/keys")).text
    audit = (await client.get("/admin/v1/audit")).text
    for text_seen in (read, listed, audit):
        assert key not in text_seen
        assert hashlib.sha256(key.encode()).hexdigest() not in text_seen

    engine = create_engine(settings.database_url)
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT key_hash, key_prefix FROM api_keys")).all()
    engine.dispose()
    assert rows == [(hashlib.sha256(key.encode()).hexdigest(), key[:10])]


async def test_limits_update_and_revoke(client: httpx.AsyncClient) -> None:
    key_id = (await client.post("/admin/v1/keys", json={"name": "k"})).json()["id"]
    limits = {"requests_per_minute": 60, "max_concurrent_requests": 4, "max_body_bytes": 65536}
    patched = await client.patch(f"/admin/v1/keys/{key_id}", json=limits)
    assert {k: patched.json()[k] for k in limits} == limits
    assert patched.json()["name"] == "k"
    revoked = await client.delete(f"/admin/v1/keys/{key_id}")
    assert revoked.status_code == 200
    assert revoked.json()["revoked_at"] is not None
    assert (await client.get("/admin/v1/keys")).json()["data"] == []
    everything = await client.get("/admin/v1/keys", params={"include_revoked": True})
    assert [k["id"] for k in everything.json()["data"]] == [key_id]
    actions = [e["action"] for e in (await client.get("/admin/v1/audit")).json()["data"]]
    assert actions == ["revoke", "update", "create"]


async def test_key_errors(client: httpx.AsyncClient) -> None:
    assert_envelope(await client.get("/admin/v1/keys/999"), 404, "key_id")
    assert_envelope(await client.delete("/admin/v1/keys/999"), 404)
    assert_envelope(await client.post("/admin/v1/keys", json={"name": ""}), 422, "name")
    bad_limit = {"name": "x", "tokens_per_minute": 0}
    assert_envelope(await client.post("/admin/v1/keys", json=bad_limit), 422, "tokens_per_minute")
    forged = {"name": "ok\r\n    1  fake-prefix  admin"}
    assert_envelope(await client.post("/admin/v1/keys", json=forged), 422, "name")
    for hidden in ("next\x85line", "csi\x9b", "admin\u202eyek", "mark\u200fed", "iso\u2066x"):
        # C1 controls and bidirectional marks: a name that shows as another's in a table
        assert_envelope(await client.post("/admin/v1/keys", json={"name": hidden}), 422, "name")
    created = await client.post("/admin/v1/keys", json={"name": "équipe données"})
    assert created.status_code == 201, created.text  # other non-ASCII names are welcome
    tiny_body = {"name": "x", "max_body_bytes": 1023}  # not even a chat's head
    assert_envelope(await client.post("/admin/v1/keys", json=tiny_body), 422, "max_body_bytes")
    no_slot = {"name": "x", "max_concurrent_requests": 0}
    assert_envelope(
        await client.post("/admin/v1/keys", json=no_slot), 422, "max_concurrent_requests"
    )


async def test_a_key_opts_out_of_the_lossless_watchdog(
    client: httpx.AsyncClient, app: FastAPI
) -> None:
    plain = (await client.post("/admin/v1/keys", json={"name": "checked"})).json()
    assert plain["lossless_opt_out"] is False  # replayed unless it says otherwise
    created = await client.post(
        "/admin/v1/keys", json={"name": "private", "lossless_opt_out": True}
    )
    assert created.status_code == 201, created.text
    key_id, secret = created.json()["id"], created.json()["key"]
    assert created.json()["lossless_opt_out"] is True
    assert (await client.get(f"/admin/v1/keys/{key_id}")).json()["lossless_opt_out"] is True
    listed = (await client.get("/admin/v1/keys")).json()["data"]
    assert {k["name"]: k["lossless_opt_out"] for k in listed} == {"checked": False, "private": True}
    keys = app.state.components.registry.snapshot.keys  # what the relay reads
    assert keys[hashlib.sha256(secret.encode()).hexdigest()].lossless_opt_out is True

    patched = await client.patch(f"/admin/v1/keys/{key_id}", json={"lossless_opt_out": False})
    assert patched.json()["lossless_opt_out"] is False
    assert keys is not app.state.components.registry.snapshot.keys  # reloaded after the change
    keys = app.state.components.registry.snapshot.keys
    assert keys[hashlib.sha256(secret.encode()).hexdigest()].lossless_opt_out is False
    renamed = await client.patch(f"/admin/v1/keys/{key_id}", json={"name": "renamed"})
    assert renamed.json()["lossless_opt_out"] is False  # a patch without it keeps it
    audit = (await client.get("/admin/v1/audit")).json()["data"]
    change = next(e for e in audit if e["action"] == "update" and e["after"]["name"] == "private")
    assert (change["before"]["lossless_opt_out"], change["after"]["lossless_opt_out"]) == (
        True,
        False,
    )
    for bad in (None, "maybe"):
        response = await client.patch(f"/admin/v1/keys/{key_id}", json={"lossless_opt_out": bad})
        assert_envelope(response, 422, "lossless_opt_out")
