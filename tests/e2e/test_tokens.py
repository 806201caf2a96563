"""Bearer JWTs end to end: a real issuer on loopback (keys made here, its JWK set served over
HTTP), a real gateway in front of a simulator, called with the official client and httpx.

A valid token is served as its team (the usage record has the team and the token's user,
no key); each kind of bad token gets its 401 or 403 and is never admitted (no record, and
the refusal counted at the door); a rotated key is read again on first sight and the removed
one refused; a team's limits hold for its tokens; the JWK set is read once for a flood of
made-up key ids."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest
from cryptography.hazmat.primitives import serialization

from gateway.errors import InvalidToken
from gateway.relay.jwks import SigningKeys
from tests.e2e.conftest import (
    ADMIN,
    SIM_MODEL,
    ModuleGatewayStarter,
    ModuleServerStarter,
    Server,
    fleet_backend,
    metric_value,
    query_rows,
    sim_args,
    wait_for_usage_records,
)
from tests.oidc_issuer import JWKS_PATH, Issuer, SigningKey, b64url

AUDIENCE = "draftgate-e2e"


@dataclass
class Stack:
    gateway: Server
    database_url: str
    issuer: Issuer
    teams: dict[str, int]  # by name

    def chat(self, token: str, request_id: str | None = None) -> httpx.Response:
        body = {"model": SIM_MODEL, "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 4}  # fmt: skip
        headers = {"authorization": f"Bearer {token}", "x-request-id": request_id or _rid()}
        url = f"{self.gateway.base_url}/v1/chat/completions"
        return httpx.post(url, json=body, headers=headers, timeout=30)

    def refused(self, reason: str) -> float:
        return metric_value(self.gateway.base_url, "draftgate_rejections_total", reason=reason)


def _rid() -> str:
    return uuid.uuid4().hex


@pytest.fixture(scope="module")
def stack(
    start_module_servers: ModuleServerStarter, start_module_gateway: ModuleGatewayStarter
) -> Iterator[Stack]:
    issuer = Issuer(AUDIENCE).start()
    [sim] = start_module_servers(sim_args("--time-scale", "50"))
    try:
        gateway, database_url = start_module_gateway(
            [fleet_backend("b-plain", sim.base_url)],
            REQUIRE_API_KEY="true",
            OIDC_ISSUER=issuer.url,
            OIDC_AUDIENCE=AUDIENCE,
            OIDC_JWKS_MIN_REFETCH_S="0",  # every unknown key id reads the set again
        )
        teams = {}
        for name, limits in (("search", {}), ("limited", {"requests_per_minute": 2})):
            created = httpx.post(
                f"{gateway.base_url}/admin/v1/teams", json={"name": name, **limits}, headers=ADMIN
            )
            assert created.status_code == 201, created.text
            teams[name] = int(created.json()["id"])
        yield Stack(gateway, database_url, issuer, teams)
    finally:
        issuer.close()


def test_a_valid_token_is_served_as_its_team_and_user(stack: Stack) -> None:
    user = f"alice-{uuid.uuid4().hex[:6]}"
    token = stack.issuer.token(draftgate_team="search", sub=user)
    client = openai.OpenAI(base_url=f"{stack.gateway.base_url}/v1", api_key=token, max_retries=0)
    rid = _rid()
    answer = client.chat.completions.create(
        model=SIM_MODEL,
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=4,
        user="what-the-body-claims",
        extra_headers={"x-request-id": rid},
    )
    assert answer.choices[0].message.content
    record = wait_for_usage_records(stack.database_url, [rid])[rid]
    assert (record["team_id"], record["api_key_id"]) == (stack.teams["search"], None)
    assert record["end_user"] == user  # the token's, not the body's `user`
    assert record["status_code"] == 200


def test_an_ec_key_added_to_the_set_is_read_and_accepted(stack: Stack) -> None:
    added = SigningKey("ES256")
    stack.issuer.keys.append(added)
    response = stack.chat(stack.issuer.token(added, draftgate_team="search"))
    assert response.status_code == 200, response.text


def _hs256_with_public_key(issuer: Issuer) -> str:
    """A token signed HS256 with the issuer's public key as the secret (algorithm confusion:
    a verifier that takes the key for a secret would accept it)."""
    key = issuer.keys[0]
    pem = key.private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    header = b64url(json.dumps({"alg": "HS256", "typ": "JWT", "kid": key.kid}).encode())
    now = int(time.time())
    claims = {"iss": issuer.url, "aud": AUDIENCE, "exp": now + 300, "draftgate_team": "search"}
    signing_input = f"{header}.{b64url(json.dumps(claims).encode())}"
    signature = hmac.new(pem, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{b64url(signature)}"


def _tampered(issuer: Issuer) -> str:
    """A valid token whose claims were changed after signing (another team)."""
    header, _, signature = issuer.token(draftgate_team="search").split(".")
    claims = {"iss": issuer.url, "aud": AUDIENCE, "exp": int(time.time()) + 300,
              "draftgate_team": "limited"}  # fmt: skip
    return f"{header}.{b64url(json.dumps(claims).encode())}.{signature}"


BAD_TOKENS: dict[str, tuple[Any, int, str, str]] = {
    # case: (token maker, status, code, words in the message)
    "expired": (lambda i: i.token(lifetime_s=-120, draftgate_team="search"), 401,
                "token_expired", "expired"),
    "wrong audience": (lambda i: i.token(aud="another-app", draftgate_team="search"), 401,
                       "invalid_token", "audience"),
    "wrong issuer": (lambda i: i.token(iss="https://elsewhere.example", draftgate_team="search"),
                     401, "invalid_token", "issuer"),
    "not yet valid": (lambda i: i.token(nbf=int(time.time()) + 600, draftgate_team="search"),
                      401, "invalid_token", "not valid yet"),
    "unknown key id": (lambda i: i.token(SigningKey(), draftgate_team="search"), 401,
                       "invalid_token", "key id"),
    "alg none": (lambda i: i.unsigned(draftgate_team="search"), 401, "invalid_token",
                 "algorithm `none`"),
    "HS256 with the public key": (_hs256_with_public_key, 401, "invalid_token",
                                  "algorithm `HS256`"),
    "tampered claims": (_tampered, 401, "invalid_token", "signature"),
    "no expiry": (lambda i: i.token(exp=None, draftgate_team="search"), 401, "invalid_token",
                  "exp"),
    "unknown team": (lambda i: i.token(draftgate_team="nobody"), 403, "team_not_found",
                     "`nobody`"),
    "no team claim": (lambda i: i.token(), 403, "team_not_found", "no `draftgate_team`"),
}  # fmt: skip


@pytest.mark.parametrize("case", BAD_TOKENS)
def test_a_bad_token_is_refused_and_never_admitted(stack: Stack, case: str) -> None:
    make, status, code, words = BAD_TOKENS[case]
    before = stack.refused(code)
    rid = _rid()
    response = stack.chat(make(stack.issuer), rid)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code
    assert words in error["message"]
    assert set(error) == {"message", "type", "param", "code"}
    assert stack.refused(code) == before + 1  # at the door, before the body was read
    _assert_no_record(stack, rid)


def _assert_no_record(stack: Stack, refused_id: str) -> None:
    """No record of `refused_id`: one request served after it is recorded, it is not."""
    after = _rid()
    assert stack.chat(stack.issuer.token(draftgate_team="search"), after).status_code == 200
    wait_for_usage_records(stack.database_url, [after])
    sql = "SELECT COUNT(*) AS n FROM usage_records WHERE client_request_id = :rid"
    assert query_rows(stack.database_url, sql, rid=refused_id) == [{"n": 0}]


def test_a_rotated_key_is_read_and_the_removed_one_refused(stack: Stack) -> None:
    issuer = stack.issuer
    before = issuer.token(draftgate_team="search")
    assert stack.chat(before).status_code == 200  # checked, and remembered
    removed, new = issuer.rotate()
    reads = issuer.jwks_reads
    assert stack.chat(issuer.token(new, draftgate_team="search")).status_code == 200
    assert issuer.jwks_reads == reads + 1  # the new key id read the set again
    for token in (before, issuer.token(removed, draftgate_team="search")):
        response = stack.chat(token)
        assert response.status_code == 401, response.text
        assert response.json()["error"]["code"] == "invalid_token"


def test_a_teams_limits_hold_for_its_tokens(stack: Stack) -> None:
    token = stack.issuer.token(draftgate_team="limited", sub="bob")
    statuses = [stack.chat(token).status_code for _ in range(3)]
    assert statuses == [200, 200, 429]
    refusal = stack.chat(token).json()["error"]
    assert refusal["code"] == "rate_limit_exceeded"
    assert "Team `limited`" in refusal["message"]


async def test_a_flood_of_made_up_key_ids_reads_the_set_once() -> None:
    issuer = Issuer(AUDIENCE).start()
    try:
        async with httpx.AsyncClient() as client:
            keys = SigningKeys(
                client, issuer.url, issuer.url + JWKS_PATH, ["RS256"],
                ttl_s=600, min_refetch_s=60, timeout_s=5,
            )  # fmt: skip
            assert (await keys.find(issuer.keys[0].kid)).key_id == issuer.keys[0].kid
            for n in range(50):
                with pytest.raises(InvalidToken, match="not among the issuer's keys"):
                    await keys.find(f"made-up-{n}")
        assert issuer.jwks_reads == 1
    finally:
        issuer.close()
