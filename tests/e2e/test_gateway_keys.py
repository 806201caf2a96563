"""API keys, limits and hostile input on /v1, end to end (DRAFTGATE_REQUIRE_API_KEY=true)."""

from __future__ import annotations

import json
import re
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.conftest import (
    ADMIN_TOKEN,
    SIM_MODEL,
    ModuleGatewayStarter,
    ModuleServerStarter,
    Server,
    ServerStarter,
    fleet_backend,
    gateway_env,
    metric_value,
    query_rows,
    sim_args,
    until,
    wait_for_usage_records,
    write_fleet,
)

MAX_BODY_BYTES = 2048
REFUSED_KEY_DELAY_S = 0.5  # the default
REGISTRY_REFRESH_S = 0.5
# A new key works, and a revoked one stops, within this (one registry refresh on an idle
# machine; a busy one may run the refresh and the polling requests late).
KEY_APPLIES_S = 15.0
MINUTE_TRIES = 3  # a try whose four requests straddle two clock minutes proves nothing
CHAT = [{"role": "user", "content": "Hello there."}]
GOOD = {"model": SIM_MODEL, "messages": CHAT, "max_tokens": 3}
GENERATED_ID = re.compile(r"^[0-9a-f]{32}$")
ENVELOPE_KEYS = {"message", "type", "param", "code"}
SIM_COUNTERS = ("vllm:request_success_total", "vllm:prompt_tokens_total")


@dataclass
class Keyed:
    """The module's gateway (keys required), its sim, and a key without limits."""

    gateway: Server
    sim: Server
    key: str
    database_url: str

    def openai(self, api_key: str) -> openai.OpenAI:
        """The official client with `api_key` (no client-side retries)."""
        return openai.OpenAI(base_url=f"{self.gateway.base_url}/v1", api_key=api_key, max_retries=0)

    def sim_counters(self) -> tuple[float, ...]:
        """What the sim has served so far."""
        return tuple(metric_value(self.sim.base_url, name) for name in SIM_COUNTERS)


def create_key(gateway: Server, **fields: Any) -> tuple[int, str]:
    """A new API key through the admin API; (id, secret)."""
    with gateway.client(ADMIN_TOKEN) as admin:
        response = admin.post("/admin/v1/keys", json={"name": "e2e", **fields})
    assert response.status_code == 201, response.text
    created = response.json()
    return created["id"], created["key"]


@pytest.fixture(scope="module")
def keyed(
    start_module_servers: ModuleServerStarter, start_module_gateway: ModuleGatewayStarter
) -> Keyed:
    """One plain sim behind a gateway that requires keys and takes bodies up to 2 KiB."""
    (sim,) = start_module_servers(sim_args("--time-scale", "50"))
    gateway, database_url = start_module_gateway(
        [fleet_backend("sim-plain", sim.base_url)],
        REQUIRE_API_KEY="true",
        MAX_BODY_BYTES=str(MAX_BODY_BYTES),
        REGISTRY_REFRESH_S=str(REGISTRY_REFRESH_S),
    )
    _, key = create_key(gateway)
    return Keyed(gateway, sim, key, database_url)


@pytest.fixture
def http(keyed: Keyed) -> Iterator[httpx.Client]:
    """A raw client for the gateway carrying the unlimited key."""
    with keyed.gateway.client(keyed.key) as client:
        yield client


def assert_envelope(response: httpx.Response, status: int, code: str | None = None) -> None:
    """`response` is the OpenAI error envelope with `status` (and `code`, when given)."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == ENVELOPE_KEYS
    assert error["message"]
    if code is not None:
        assert error["code"] == code


def wait_for_status(client: httpx.Client, status: int, timeout_s: float = KEY_APPLIES_S) -> None:
    """Poll a good chat until it answers `status`."""
    deadline = time.monotonic() + timeout_s
    while (seen := client.post("/v1/chat/completions", json=GOOD).status_code) != status:
        assert time.monotonic() < deadline, f"still {seen}, not {status}, after {timeout_s} s"
        time.sleep(0.05)


def test_a_missing_or_wrong_key_is_401(keyed: Keyed) -> None:
    before = keyed.sim_counters()
    wrong = [{}, {"Authorization": "Bearer sk-not-a-key"}, {"Authorization": f"Basic {keyed.key}"}]
    with httpx.Client(base_url=keyed.gateway.base_url) as http:
        for headers in wrong:
            response = http.post("/v1/chat/completions", json=GOOD, headers=headers)
            assert_envelope(response, 401, "invalid_api_key")
    with keyed.openai("sk-wrong") as client, pytest.raises(openai.AuthenticationError) as raised:
        client.completions.create(model=SIM_MODEL, prompt="hi", max_tokens=2)
    assert isinstance(raised.value.body, dict)
    assert raised.value.body["code"] == "invalid_api_key"
    assert keyed.sim_counters() == before


def read_response(sock: socket.socket) -> bytes:
    """One whole HTTP response (its head and its Content-Length of body) from `sock`."""
    answer = b""
    while b"\r\n\r\n" not in answer or len(answer.partition(b"\r\n\r\n")[2]) < int(
        re.search(rb"(?i)\r\ncontent-length: *(\d+)", answer)[1]  # type: ignore[index]
    ):
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed after {answer[:300]!r}"
        answer += chunk
    return answer


def test_a_wrong_key_is_refused_before_its_body_is_read_and_leaves_no_record(
    keyed: Keyed,
) -> None:
    """The key is in a header: the gateway answers 401 on the head alone, without waiting
    for the body it announces (here never sent), and writes no ledger record, only the
    rejection's count. The request after it, with a key, is recorded as ever."""
    rejected = {"name": "draftgate_rejections_total", "reason": "invalid_api_key"}
    before = metric_value(keyed.gateway.base_url, **rejected)
    refused_id, served_id = "unkeyed-" + uuid.uuid4().hex[:12], "keyed-" + uuid.uuid4().hex[:12]
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
        b"Content-Type: application/json\r\nAuthorization: Bearer sk-not-a-key\r\n"
        b"X-Request-Id: %s\r\nContent-Length: %d\r\n\r\n"
    ) % (refused_id.encode(), MAX_BODY_BYTES)
    with socket.create_connection(("127.0.0.1", keyed.gateway.port), timeout=60) as sock:
        sock.sendall(head)  # and no body: the old gateway waited for it, then timed out
        asked = time.monotonic()
        answer = read_response(sock)
    assert time.monotonic() - asked >= REFUSED_KEY_DELAY_S  # held, as a retrying loop would be
    assert answer.startswith(b"HTTP/1.1 401 "), answer[:200]
    assert b'"invalid_api_key"' in answer
    with keyed.gateway.client(keyed.key) as http:
        response = http.post("/v1/chat/completions", json=GOOD, headers={"x-request-id": served_id})
    assert response.status_code == 200, response.text
    wait_for_usage_records(keyed.database_url, [served_id])  # the ledger writes in order
    sql = "SELECT request_id FROM usage_records WHERE client_request_id = :rid"
    assert query_rows(keyed.database_url, sql, rid=refused_id) == []
    assert metric_value(keyed.gateway.base_url, **rejected) == before + 1


def _chat_of(size: int) -> bytes:
    """A good chat request whose body is `size` bytes."""
    body = json.dumps({**GOOD, "messages": [{"role": "user", "content": ""}]}).encode()
    return body.replace(b'"content": ""', b'"content": "%s"' % (b"a" * (size - len(body))))


def test_a_keys_own_body_bound_holds_under_the_gateways(keyed: Keyed) -> None:
    """A key created with `max_body_bytes` is refused a larger body with 413 (and, when the
    size is announced, before any of it is sent); a key without one, or with one above the
    gateway's, is bound by the gateway's (2 KiB here)."""
    _, small = create_key(keyed.gateway, max_body_bytes=1024)
    _, large = create_key(keyed.gateway, max_body_bytes=1024 * 1024)
    for secret in (small, large):
        with keyed.gateway.client(secret) as http:
            wait_for_status(http, 200)
    body = _chat_of(1500)
    assert len(body) == 1500
    json_type = {"content-type": "application/json"}
    for secret, status in ((small, 413), (keyed.key, 200), (large, 200)):
        with keyed.gateway.client(secret) as http:
            response = http.post("/v1/chat/completions", content=body, headers=json_type)
        if status == 413:
            assert_envelope(response, 413)
            assert "1024 bytes" in response.json()["error"]["message"]
        else:
            assert response.status_code == status, response.text
    with keyed.gateway.client(small) as http:  # chunked: no size announced, counted as read
        chunks = iter([body[:700], body[700:]])
        response = http.post("/v1/chat/completions", content=chunks, headers=json_type)
    assert_envelope(response, 413)
    with keyed.gateway.client(large) as http:  # its own bound is above the gateway's
        response = http.post("/v1/chat/completions", content=_chat_of(MAX_BODY_BYTES + 1))
    assert_envelope(response, 413)
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
        b"Content-Type: application/json\r\nAuthorization: Bearer %s\r\n"
        b"Content-Length: 1500\r\n\r\n"
    ) % small.encode()
    with socket.create_connection(("127.0.0.1", keyed.gateway.port), timeout=60) as sock:
        sock.sendall(head)  # and no body: the size it announced is enough to refuse it
        answer = read_response(sock)
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]


def test_listing_models_needs_a_key(keyed: Keyed) -> None:
    with httpx.Client(base_url=keyed.gateway.base_url) as http:
        assert_envelope(http.get("/v1/models"), 401, "invalid_api_key")
    with keyed.openai(keyed.key) as client:
        assert [m.id for m in client.models.list().data] == [SIM_MODEL]


def test_a_key_sees_and_retrieves_only_the_models_it_may_use(keyed: Keyed) -> None:
    _, other = create_key(keyed.gateway, allowed_models=["other/model"])
    _, mine = create_key(keyed.gateway, allowed_models=[SIM_MODEL])
    for secret in (other, mine):  # until the registry knows both keys
        with keyed.gateway.client(secret) as http:
            deadline = time.monotonic() + KEY_APPLIES_S
            while http.get("/v1/models").status_code == 401:
                assert time.monotonic() < deadline, "the new key was never accepted"
                time.sleep(0.05)
    with keyed.openai(other) as client:
        assert client.models.list().data == []
        with pytest.raises(openai.NotFoundError) as raised:
            client.models.retrieve(SIM_MODEL)
        assert isinstance(raised.value.body, dict)
        assert raised.value.body["code"] == "model_not_found"
    with keyed.openai(mine) as client:
        assert [m.id for m in client.models.list().data] == [SIM_MODEL]
        assert client.models.retrieve(SIM_MODEL).id == SIM_MODEL
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve("no/such-model")


def test_a_created_key_works_at_once_and_a_revoked_one_stops(keyed: Keyed) -> None:
    key_id, secret = create_key(keyed.gateway)
    with keyed.gateway.client(secret) as http:
        wait_for_status(http, 200)
        with keyed.openai(secret) as client:
            chat = client.chat.completions.create(model=SIM_MODEL, messages=CHAT, max_tokens=4)
        assert chat.choices[0].message.content
        with keyed.gateway.client(ADMIN_TOKEN) as admin:
            revoked = admin.delete(f"/admin/v1/keys/{key_id}")
        assert revoked.status_code == 200, revoked.text
        wait_for_status(http, 401, REGISTRY_REFRESH_S + KEY_APPLIES_S)
        assert_envelope(http.post("/v1/chat/completions", json=GOOD), 401, "invalid_api_key")


def test_with_a_key_any_host_and_a_body_without_content_type_are_served(
    http: httpx.Client,
) -> None:
    """The keyless demo's door (tests/reliability/test_hostile_requests.py) is not needed
    here: a page on another site has no key. A body without a type is read as JSON, as vLLM
    reads it."""
    body = json.dumps(GOOD).encode()
    untyped = http.post("/v1/chat/completions", content=body, headers={"Host": "gw.example"})
    assert untyped.status_code == 200, untyped.text


def test_a_key_limited_to_other_models_is_403(keyed: Keyed) -> None:
    _, secret = create_key(keyed.gateway, allowed_models=["other/model"])
    before = keyed.sim_counters()
    with keyed.gateway.client(secret) as http:
        assert_envelope(http.post("/v1/chat/completions", json=GOOD), 403, "model_not_allowed")
    with keyed.openai(secret) as client, pytest.raises(openai.PermissionDeniedError):
        client.chat.completions.create(model=SIM_MODEL, messages=CHAT, max_tokens=2)
    assert keyed.sim_counters() == before
    _, allowed = create_key(keyed.gateway, allowed_models=[SIM_MODEL])
    with keyed.gateway.client(allowed) as http:
        assert http.post("/v1/chat/completions", json=GOOD).status_code == 200


def test_the_fourth_request_in_a_minute_is_429(keyed: Keyed) -> None:
    for _ in range(MINUTE_TRIES):
        minute = time.time() // 60  # the limiter counts per clock minute
        _, secret = create_key(keyed.gateway, requests_per_minute=3)
        with keyed.openai(secret) as client:
            for _ in range(3):
                client.chat.completions.create(model=SIM_MODEL, messages=CHAT, max_tokens=2)
            try:
                client.chat.completions.create(model=SIM_MODEL, messages=CHAT, max_tokens=2)
            except openai.RateLimitError as raised:
                response = raised.response
                break
        # admitted: only right if the four requests straddled two minutes (then try again)
        assert time.time() // 60 != minute, "a fourth request in one minute was admitted"
    else:
        pytest.fail(f"{MINUTE_TRIES} tries each straddled two clock minutes")
    assert_envelope(response, 429, "rate_limit_exceeded")
    assert 0 < int(response.headers["retry-after"]) <= 60


def chunked(body: bytes) -> Iterator[bytes]:
    """`body` sent in pieces, without a content-length."""
    for start in range(0, len(body), 512):
        yield body[start : start + 512]


OVERSIZED = b'{"model": "%s", "prompt": "%s"}' % (SIM_MODEL.encode(), b"x" * MAX_BODY_BYTES)
JSON = {"content-type": "application/json"}
BAD_INPUT: dict[str, tuple[dict[str, Any], int]] = {
    "malformed JSON": ({"content": b'{"model": "x",', "headers": JSON}, 400),
    "empty body": ({"content": b"", "headers": JSON}, 400),
    "not UTF-8": ({"content": b'{"model": "\xff"}', "headers": JSON}, 400),
    "JSON array": ({"json": [GOOD]}, 400),
    "JSON string": ({"json": "hello"}, 400),
    "missing model": ({"json": {"messages": CHAT}}, 400),
    "model not a string": ({"json": {**GOOD, "model": 5}}, 400),
    "model empty": ({"json": {**GOOD, "model": ""}}, 400),
    "text/plain": ({"content": b'{"model": "x"}', "headers": {"content-type": "text/plain"}}, 415),
    "form": ({"data": {"model": SIM_MODEL}}, 415),
    "too large": ({"content": OVERSIZED, "headers": JSON}, 413),
    "too large, chunked": ({"content": chunked(OVERSIZED), "headers": JSON}, 413),
}


@pytest.mark.parametrize("case", BAD_INPUT, ids=list(BAD_INPUT))
def test_bad_input_is_refused_before_any_backend(
    keyed: Keyed, http: httpx.Client, case: str
) -> None:
    request, status = BAD_INPUT[case]
    before = keyed.sim_counters()
    for path in ("/v1/chat/completions", "/v1/completions"):
        response = http.post(path, **request)
        assert_envelope(response, status)
        assert GENERATED_ID.match(response.headers["x-request-id"])
        if isinstance(request.get("content"), Iterator):
            break  # the generator is spent
    assert keyed.sim_counters() == before
    assert http.get("/health").status_code == 200
    response = http.post("/v1/chat/completions", json=GOOD)
    assert response.status_code == 200, response.text


HOSTILE_IDS = [
    "has spaces",
    "semi;colon",
    "abc%0D%0ASet-Cookie:%20evil=1",
    'quote"<script>',
    "tab\there",
    "r" * 65,
    b"\xff\xfe-not-ascii",
]


@pytest.mark.parametrize("sent", HOSTILE_IDS, ids=range(len(HOSTILE_IDS)))
def test_a_hostile_request_id_is_replaced(http: httpx.Client, sent: str | bytes) -> None:
    response = http.post("/v1/chat/completions", json=GOOD, headers={"x-request-id": sent})
    assert response.status_code == 200, response.text
    assert GENERATED_ID.match(response.headers["x-request-id"])
    assert "set-cookie" not in response.headers


def test_metrics_name_no_key_and_drop_a_deleted_backends_health(keyed: Keyed) -> None:
    """/metrics answers whoever reaches the client port: with keys required and no metrics
    token, budget series name a key by id only. A deleted backend's health series goes with
    it (it stayed for good)."""
    with keyed.gateway.client(ADMIN_TOKEN) as admin:
        created = admin.post("/admin/v1/keys", json={"name": "team-secret", "budget_usd": 5})
        key_id = str(created.json()["id"])
        extra = {"name": "sim-extra", "url": keyed.sim.base_url, "model": SIM_MODEL,
                 "method": "plain", "gpu_type": "B200"}  # fmt: skip
        assert admin.post("/admin/v1/backends", json=extra).status_code == 201
        url = keyed.gateway.base_url
        healthy = {"name": "draftgate_backend_healthy", "backend": "sim-extra"}
        until(lambda: metric_value(url, **healthy) == 1, "the extra backend's health series")
        until(lambda: f'key_id="{key_id}"' in httpx.get(f"{url}/metrics").text, "budget series")
        text = httpx.get(f"{url}/metrics").text
        assert f'key_name="key {key_id}"' in text
        assert "team-secret" not in text
        assert admin.delete("/admin/v1/backends/sim-extra").status_code == 204

        def gone() -> bool:
            text = httpx.get(f"{url}/metrics").text
            return not any(
                line.startswith("draftgate_backend_healthy{") and 'backend="sim-extra"' in line
                for line in text.splitlines()
            )

        until(gone, "the deleted backend's health series gone")


def test_a_metrics_token_guards_metrics_and_lets_them_name_keys(
    keyed: Keyed, start_server: ServerStarter, tmp_path: Path
) -> None:
    token = "metrics-" + uuid.uuid4().hex
    fleet = write_fleet(tmp_path / "fleet.yaml", [fleet_backend("sim-plain", keyed.sim.base_url)])
    env = gateway_env(
        f"sqlite:///{tmp_path}/draftgate.db", fleet, REQUIRE_API_KEY="true", METRICS_TOKEN=token
    )
    gateway = start_server("gateway", env=env)
    with gateway.client(ADMIN_TOKEN) as admin:
        admin.post("/admin/v1/keys", json={"name": "team-named", "budget_usd": 5})
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": token}):
        assert_envelope(httpx.get(f"{gateway.base_url}/metrics", headers=headers), 401)
    with gateway.client(token) as scraper:
        until(lambda: 'key_name="team-named"' in scraper.get("/metrics").text, "a named key")
