"""Who the audit log names for a change through the admin API: the admin token's name, or
the person a login proxy signed in, via that token, when the proxy's header comes from a
trusted address; the same header from any other address is refused and changes nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx

from gateway.app import create_app
from gateway.settings import Settings
from tests.conftest import ADMIN_TOKEN, READ_TOKEN

USER_HEADER = "x-forwarded-user"
PROXY = ("10.0.0.5", 40123)  # the dashboard's address, in the trusted block
STRANGER = ("192.168.7.9", 40123)


@asynccontextmanager
async def gateway(
    database_url: str, peer: tuple[str, int], **settings: Any
) -> AsyncIterator[httpx.AsyncClient]:
    """An in-process gateway on `settings`, called from the address `peer`."""
    application = create_app(
        Settings(
            database_url=database_url,
            admin_token=ADMIN_TOKEN,
            admin_read_token=READ_TOKEN,
            **settings,
        )
    )
    transport = httpx.ASGITransport(app=application, client=peer)
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with (
        application.router.lifespan_context(application),
        httpx.AsyncClient(transport=transport, base_url="http://gw.test", headers=headers) as c,
    ):
        yield c


async def team_actors(client: httpx.AsyncClient) -> list[str]:
    response = await client.get("/admin/v1/audit", params={"resource_type": "team"})
    assert response.status_code == 200, response.text
    return [entry["actor"] for entry in response.json()["data"]]


async def test_a_change_is_named_by_its_tokens_name(database_url: str) -> None:
    async with gateway(database_url, STRANGER, admin_token_name="ops-bot") as client:
        created = await client.post("/admin/v1/teams", json={"name": "search"})
        assert created.status_code == 201, created.text
        assert await team_actors(client) == ["ops-bot"]
        whoami = (await client.get("/admin/v1/whoami")).json()
        assert whoami == {"scope": "admin", "actor": "ops-bot"}


async def test_without_a_name_a_change_is_the_admin_apis(database_url: str) -> None:
    async with gateway(database_url, STRANGER) as client:
        assert (await client.post("/admin/v1/teams", json={"name": "search"})).status_code == 201
        assert await team_actors(client) == ["admin-api"]


async def test_a_trusted_proxy_names_the_person(database_url: str) -> None:
    proxied = {"admin_user_header": USER_HEADER, "admin_trusted_proxies": "10.0.0.0/24"}
    async with gateway(database_url, PROXY, **proxied) as client:
        person = {USER_HEADER: "alice@example.com"}
        created = await client.post("/admin/v1/teams", json={"name": "ads"}, headers=person)
        assert created.status_code == 201, created.text
        renamed = await client.patch(
            f"/admin/v1/teams/{created.json()['id']}", json={"name": "ads-eu"}, headers=person
        )
        assert renamed.status_code == 200, renamed.text
        plain = await client.post("/admin/v1/teams", json={"name": "lab"})
        assert plain.status_code == 201, plain.text
        assert await team_actors(client) == [
            "admin-api",  # no header: the token's own name
            "alice@example.com via admin-api",
            "alice@example.com via admin-api",
        ]


async def test_the_header_from_an_untrusted_address_is_refused(database_url: str) -> None:
    proxied = {"admin_user_header": USER_HEADER, "admin_trusted_proxies": "10.0.0.0/24"}
    async with gateway(database_url, STRANGER, **proxied) as client:
        person = {USER_HEADER: "mallory@example.com"}
        refused = await client.post("/admin/v1/teams", json={"name": "ads"}, headers=person)
        assert refused.status_code == 403, refused.text
        error = refused.json()["error"]
        assert error["code"] == "untrusted_proxy"
        assert "DRAFTGATE_ADMIN_TRUSTED_PROXIES" in error["message"]
        assert "192.168.7.9" in error["message"]
        assert (await client.get("/admin/v1/teams")).json()["data"] == []
        assert await team_actors(client) == []
        read = await client.get("/admin/v1/teams", headers=person)
        assert read.status_code == 403  # never silently ignored, reads included


async def test_the_header_names_no_one_while_it_is_off(database_url: str) -> None:
    async with gateway(database_url, STRANGER) as client:
        person = {USER_HEADER: "mallory@example.com"}
        created = await client.post("/admin/v1/teams", json={"name": "ads"}, headers=person)
        assert created.status_code == 201, created.text
        assert await team_actors(client) == ["admin-api"]


async def test_a_person_too_long_for_the_audit_log_is_refused(database_url: str) -> None:
    proxied = {"admin_user_header": USER_HEADER, "admin_trusted_proxies": "10.0.0.5"}
    async with gateway(database_url, PROXY, **proxied) as client:
        person = {USER_HEADER: "a" * 60 + "@example.com"}
        refused = await client.post("/admin/v1/teams", json={"name": "ads"}, headers=person)
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["code"] == "invalid_admin_user"
        assert await team_actors(client) == []


async def test_a_bad_token_is_a_401_before_the_proxy_is_judged(database_url: str) -> None:
    proxied = {"admin_user_header": USER_HEADER}
    async with gateway(database_url, STRANGER, **proxied) as client:
        headers = {"Authorization": "Bearer wrong-token-0123456789", USER_HEADER: "x@y"}
        refused = await client.post("/admin/v1/teams", json={"name": "ads"}, headers=headers)
        assert refused.status_code == 401
