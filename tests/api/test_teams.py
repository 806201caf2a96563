"""Teams: created, changed and deleted through the admin API, audited; keys join one by
`team_id`; a team with active keys is not deleted; a team's allowed models bound its keys'."""

from __future__ import annotations

import httpx
from fastapi import FastAPI

from gateway.registry import Registry


async def _team(client: httpx.AsyncClient, **fields: object) -> dict[str, object]:
    created = await client.post("/admin/v1/teams", json={"name": "search"} | fields)
    assert created.status_code == 201, created.text
    return dict(created.json())


async def test_a_team_is_created_changed_and_listed_with_its_keys(
    client: httpx.AsyncClient,
) -> None:
    team = await _team(client, budget_usd=50, tokens_per_minute=10_000)
    assert (team["name"], team["budget_usd"], team["budget_period"]) == ("search", 50, "monthly")
    assert team["keys"] == 0
    key = await client.post("/admin/v1/keys", json={"name": "k1", "team_id": team["id"]})
    assert key.status_code == 201, key.text
    assert key.json()["team_id"] == team["id"]
    patched = await client.patch(
        f"/admin/v1/teams/{team['id']}", json={"budget_usd": None, "allowed_models": ["m"]}
    )
    assert patched.status_code == 200, patched.text
    assert (patched.json()["budget_usd"], patched.json()["allowed_models"]) == (None, ["m"])
    listed = (await client.get("/admin/v1/teams")).json()["data"]
    assert [(t["name"], t["keys"]) for t in listed] == [("search", 1)]
    audit = (await client.get("/admin/v1/audit", params={"resource_type": "team"})).json()
    assert sorted(e["action"] for e in audit["data"]) == ["create", "update"]


async def test_bad_teams_and_unknown_ones_are_refused(client: httpx.AsyncClient) -> None:
    await _team(client)
    again = await client.post("/admin/v1/teams", json={"name": "search"})
    assert again.status_code == 409, again.text
    assert again.json()["error"]["message"] == "Team 'search' already exists"
    bad = await client.post("/admin/v1/teams", json={"name": "x", "budget_usd": -1})
    assert bad.status_code == 422, bad.text
    typo = await client.post("/admin/v1/teams", json={"name": "x", "budget": 1})
    assert typo.status_code == 422, typo.text
    orphan = await client.post("/admin/v1/keys", json={"name": "k", "team_id": 999})
    assert orphan.status_code == 404, orphan.text
    assert orphan.json()["error"]["param"] == "team_id"
    missing = await client.get("/admin/v1/teams/999")
    assert missing.status_code == 404


async def test_a_team_with_active_keys_is_not_deleted(client: httpx.AsyncClient) -> None:
    team = await _team(client)
    key = (await client.post("/admin/v1/keys", json={"name": "k", "team_id": team["id"]})).json()
    refused = await client.delete(f"/admin/v1/teams/{team['id']}")
    assert refused.status_code == 409, refused.text
    assert "1 active keys" in refused.json()["error"]["message"]
    assert (await client.delete(f"/admin/v1/keys/{key['id']}")).status_code == 200
    deleted = await client.delete(f"/admin/v1/teams/{team['id']}")
    assert deleted.status_code == 200, deleted.text
    assert (await client.get(f"/admin/v1/teams/{team['id']}")).status_code == 404
    revoked = (await client.get(f"/admin/v1/keys/{key['id']}")).json()
    assert revoked["team_id"] is None  # it left the team; its usage records keep the id


async def test_a_teams_allowed_models_bound_its_keys(
    client: httpx.AsyncClient, app: FastAPI
) -> None:
    team = await _team(client, allowed_models=["a", "b"])
    for name, own in (("any", None), ("narrow", ["b", "c"])):
        body = {"name": name, "team_id": team["id"], "allowed_models": own}
        assert (await client.post("/admin/v1/keys", json=body)).status_code == 201
    alone = await client.post("/admin/v1/keys", json={"name": "alone", "allowed_models": ["c"]})
    assert alone.status_code == 201
    registry: Registry = app.state.components.registry
    registry.load()
    allowed = {k.name: k.allowed_models for k in registry.snapshot.keys.values()}
    assert allowed == {
        "any": frozenset({"a", "b"}),
        "narrow": frozenset({"b"}),
        "alone": frozenset({"c"}),
    }
