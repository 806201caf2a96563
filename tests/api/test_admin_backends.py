"""Admin API for backends, in process, on SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from gateway.settings import Settings
from tests.conftest import admin_client

EAGLE3 = {
    "name": "qwen-eagle3",
    "url": "http://127.0.0.1:8102",
    "model": "Qwen/Qwen3-8B",
    "method": "eagle3",
    "k": 3,
    "drafter": "RedHatAI/Qwen3-8B-speculator.eagle3",
}


def nested(value: Any, depth: int) -> Any:
    """`value` inside `depth` objects."""
    for _ in range(depth):
        value = {"a": value}
    return value


def assert_envelope(response: httpx.Response, status: int, param: str | None = None) -> str:
    """The response is an OpenAI error envelope with this status; returns the message."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str)
    assert error["message"]
    if param is not None:
        assert error["param"] == param
    message: str = error["message"]
    return message


async def test_create_list_read_and_audit(client: httpx.AsyncClient) -> None:
    created = await client.post("/admin/v1/backends", json=EAGLE3)
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["speculative_config"] == {
        "method": "eagle3",
        "model": "RedHatAI/Qwen3-8B-speculator.eagle3",
        "num_speculative_tokens": 3,
    }
    assert (body["gpu_type"], body["gpu_count"], body["enabled"]) == ("B200", 1, True)

    listed = (await client.get("/admin/v1/backends")).json()
    assert listed["object"] == "list"
    assert [b["name"] for b in listed["data"]] == ["qwen-eagle3"]
    assert (await client.get("/admin/v1/backends/qwen-eagle3")).json() == body

    audit = (await client.get("/admin/v1/audit", params={"resource_type": "backend"})).json()
    [entry] = audit["data"]
    assert (entry["action"], entry["resource_id"]) == ("create", "qwen-eagle3")
    assert entry["before"] is None
    assert entry["after"]["speculative_config"] == body["speculative_config"]


async def test_p_eagle_renders_parallel_drafting(client: httpx.AsyncClient) -> None:
    backend = {
        **EAGLE3,
        "name": "gptoss-peagle",
        "model": "openai/gpt-oss-20b",
        "method": "p-eagle",
        "k": 7,
        "drafter": "amazon/GPT-OSS-20B-P-EAGLE",
        "gpu_type": "H100",
        "gpu_count": 2,
    }
    created = (await client.post("/admin/v1/backends", json=backend)).json()
    assert created["speculative_config"] == {
        "method": "eagle3",
        "model": "amazon/GPT-OSS-20B-P-EAGLE",
        "num_speculative_tokens": 7,
        "parallel_drafting": True,
    }


async def test_dspark_with_schedule_and_adaptive_verification(client: httpx.AsyncClient) -> None:
    backend = {
        "name": "dsv4-dspark",
        "url": "http://127.0.0.1:8105",
        "model": "deepseek-ai/DeepSeek-V4-Flash-DSpark",
        "method": "dspark",
        "k": 11,
        "speculative_options": {
            "num_speculative_tokens_per_batch_size": [[1, 32, 7], [33, 128, 5], [129, 512, 3]],
            "enable_adaptive_verification": True,
        },
    }
    created = await client.post("/admin/v1/backends", json=backend)
    assert created.status_code == 201, created.text
    assert created.json()["speculative_config"] == {
        "method": "dspark",
        "num_speculative_tokens": 11,
        "num_speculative_tokens_per_batch_size": [[1, 32, 7], [33, 128, 5], [129, 512, 3]],
        "enable_adaptive_verification": True,
    }


async def test_patch_disables_and_records_before_and_after(client: httpx.AsyncClient) -> None:
    await client.post("/admin/v1/backends", json=EAGLE3)
    patched = await client.patch("/admin/v1/backends/qwen-eagle3", json={"enabled": False})
    assert patched.status_code == 200, patched.text
    assert patched.json()["enabled"] is False
    [update, _, _] = (await client.get("/admin/v1/audit")).json()["data"]
    assert update["action"] == "update"
    assert (update["before"]["enabled"], update["after"]["enabled"]) == (True, False)


async def test_patch_that_changes_nothing_is_not_audited(client: httpx.AsyncClient) -> None:
    await client.post("/admin/v1/backends", json=EAGLE3)
    same = await client.patch("/admin/v1/backends/qwen-eagle3", json={"k": 3})
    assert same.status_code == 200
    actions = [e["action"] for e in (await client.get("/admin/v1/audit")).json()["data"]]
    assert actions == ["create", "create"]  # the backend and its model


async def test_patch_is_validated_as_a_whole(client: httpx.AsyncClient) -> None:
    await client.post("/admin/v1/backends", json=EAGLE3)
    response = await client.patch("/admin/v1/backends/qwen-eagle3", json={"method": "dflash"})
    # Still K=3 with the EAGLE-3 drafter: valid for dflash too, so it is accepted.
    assert response.status_code == 200
    response = await client.patch("/admin/v1/backends/qwen-eagle3", json={"drafter": None})
    message = assert_envelope(response, 422, param="drafter")
    assert "needs a drafter" in message
    unchanged = (await client.get("/admin/v1/backends/qwen-eagle3")).json()
    assert unchanged["drafter"] == EAGLE3["drafter"]


async def test_delete_then_404(client: httpx.AsyncClient) -> None:
    await client.post("/admin/v1/backends", json=EAGLE3)
    assert (await client.delete("/admin/v1/backends/qwen-eagle3")).status_code == 204
    assert_envelope(await client.get("/admin/v1/backends/qwen-eagle3"), 404, param="name")
    assert_envelope(await client.delete("/admin/v1/backends/qwen-eagle3"), 404)
    [delete, *_] = (await client.get("/admin/v1/audit")).json()["data"]
    assert (delete["action"], delete["after"]) == ("delete", None)
    assert delete["before"]["name"] == "qwen-eagle3"


async def test_duplicate_name_is_409_and_leaves_no_trace(client: httpx.AsyncClient) -> None:
    await client.post("/admin/v1/backends", json=EAGLE3)
    again = await client.post("/admin/v1/backends", json={**EAGLE3, "url": "http://10.0.0.9:1"})
    assert "already exists" in assert_envelope(again, 409)
    assert len((await client.get("/admin/v1/audit")).json()["data"]) == 2
    assert (await client.get("/admin/v1/backends")).json()["data"][0]["url"] == EAGLE3["url"]


async def test_list_filters_by_model(client: httpx.AsyncClient) -> None:
    await client.post("/admin/v1/backends", json=EAGLE3)
    other = {**EAGLE3, "name": "llama-plain", "model": "meta/llama", "method": "plain"}
    other.pop("k"), other.pop("drafter")
    assert (await client.post("/admin/v1/backends", json=other)).status_code == 201
    listed = await client.get("/admin/v1/backends", params={"model": "meta/llama"})
    assert [b["name"] for b in listed.json()["data"]] == ["llama-plain"]


async def test_a_patch_to_a_forbidden_url_is_refused_too(client: httpx.AsyncClient) -> None:
    assert (await client.post("/admin/v1/backends", json=EAGLE3)).status_code == 201
    patch = {"url": "http://169.254.169.254:8000"}
    response = await client.patch(f"/admin/v1/backends/{EAGLE3['name']}", json=patch)
    assert "DRAFTGATE_ALLOW_LINK_LOCAL_BACKENDS" in assert_envelope(response, 422, param="url")
    stored = (await client.get(f"/admin/v1/backends/{EAGLE3['name']}")).json()
    assert stored["url"] == EAGLE3["url"]


async def test_a_backend_key_is_write_only(client: httpx.AsyncClient) -> None:
    secret = "sk-written-not-read"
    created = await client.post("/admin/v1/backends", json={**EAGLE3, "api_key": secret})
    assert created.status_code == 201, created.text
    assert created.json()["has_api_key"] is True
    name = EAGLE3["name"]
    renamed = await client.patch(f"/admin/v1/backends/{name}", json={"gpu_count": 2})
    assert renamed.json()["has_api_key"] is True  # a patch without it keeps it
    cleared = await client.patch(f"/admin/v1/backends/{name}", json={"api_key": None})
    assert cleared.json()["has_api_key"] is False
    texts = [created.text, renamed.text, (await client.get("/admin/v1/audit")).text]
    assert all(secret not in text for text in texts)
    spaced = await client.patch(f"/admin/v1/backends/{name}", json={"api_key": "a b"})
    assert_envelope(spaced, 422, param="api_key")


async def test_link_local_backends_can_be_allowed(settings: Settings) -> None:
    allowing = settings.model_copy(update={"allow_link_local_backends": True})
    async with admin_client(allowing) as client:
        body = {**EAGLE3, "url": "http://[fe80::1]:8000"}
        response = await client.post("/admin/v1/backends", json=body)
    assert response.status_code == 201, response.text
    assert response.json()["url"] == "http://[fe80::1]:8000"


async def test_speculative_options_nested_900_deep_are_a_422_not_a_500(
    client: httpx.AsyncClient,
) -> None:
    body = {**EAGLE3, "speculative_options": nested(1, 900)}
    response = await client.post("/admin/v1/backends", json=body)
    assert response.status_code == 422, response.text


@pytest.mark.parametrize(
    ("change", "param", "fragment"),
    [
        ({"k": 0}, "k", "num_speculative_tokens must be > 0 for method 'eagle3', got k=0"),
        ({"method": "dflash", "drafter": None}, "drafter", "'dflash' needs a drafter"),
        ({"method": "peagle"}, "method", "Input should be"),
        (
            {"speculative_options": {"enable_adaptive_verification": True}},
            "speculative_options",
            "only supported by method 'dspark', got method='eagle3'",
        ),
        (
            {"speculative_options": {"num_speculative_tokens": 9}},
            "speculative_options",
            "num_speculative_tokens",
        ),
        ({"url": "http://127.0.0.1:8102/v1"}, "url", "without /v1"),
        ({"url": "ftp://x"}, "url", "URL scheme"),
        ({"url": "http://user:secret@127.0.0.1:8102"}, "url", "must not carry credentials"),
        ({"url": "http://127.0.0.1:8102#"}, "url", "query or a fragment"),
        ({"url": "http://127.0.0.1:8102/?x=1"}, "url", "query or a fragment"),
        ({"url": "http://169.254.169.254"}, "url", "link-local or cloud metadata"),
        ({"url": "http://2852039166"}, "url", "link-local or cloud metadata"),
        ({"url": "http://[fe80::1]:8000"}, "url", "link-local or cloud metadata"),
        ({"url": "http://[::ffff:169.254.169.254]"}, "url", "link-local or cloud metadata"),
        ({"url": "http://metadata.google.internal"}, "url", "link-local or cloud metadata"),
        ({"url": "http://[64:ff9b::a9fe:a9fe]"}, "url", "link-local or cloud metadata"),
        ({"url": "http://[2002:a9fe:a9fe::]:8000"}, "url", "link-local or cloud metadata"),
        ({"url": "http://0.0.0.0:8000"}, "url", "where a server listens"),
        ({"url": "http://[::]:8000"}, "url", "where a server listens"),
        ({"url": "http://0:8000"}, "url", "where a server listens"),
        ({"k": 2**62}, "k", "less than or equal to 64"),
        (
            {"speculative_options": nested({"x": 1}, 9)},
            "speculative_options",
            "nest more than 8 deep",
        ),
        ({"gpu_count": 0}, "gpu_count", "greater than or equal to 1"),
        ({"name": "bad name!"}, "name", "pattern"),
        ({"colour": "red"}, "colour", "Extra inputs"),
    ],
)
async def test_invalid_backend_is_422_naming_the_field(
    client: httpx.AsyncClient, change: dict[str, Any], param: str, fragment: str
) -> None:
    response = await client.post("/admin/v1/backends", json={**EAGLE3, **change})
    assert fragment in assert_envelope(response, 422, param=param)
    assert (await client.get("/admin/v1/backends")).json()["data"] == []


@pytest.mark.parametrize(
    "content",
    [
        b"{",
        b"",
        b"null",
        b"[]",
        b'"backend"',
        b'{"name": null}',
        b'{"name": {"nested": [1, 2]}, "k": "three"}',
        b'{"name": "x", "url": "http://h", "model": "m", "method": "eagle3", "k": 1e400}',
        b'{"name": "x", "url": "http://h", "model": "m", "method": "eagle3", "k": 1'
        + b"0" * 30
        + b"}",
        b"\xff\xfe\x00",
        b'{"name": "' + b"a" * 10_000 + b'"}',
    ],
)
async def test_malformed_bodies_are_clean_errors(client: httpx.AsyncClient, content: bytes) -> None:
    response = await client.post(
        "/admin/v1/backends", content=content, headers={"content-type": "application/json"}
    )
    assert 400 <= response.status_code < 500
    assert_envelope(response, response.status_code)


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong-token"}, {"Authorization": "Basic dGVzdA=="}],
)
async def test_admin_needs_the_token(client: httpx.AsyncClient, headers: dict[str, str]) -> None:
    client.headers.pop("Authorization")
    response = await client.get("/admin/v1/backends", headers=headers)
    assert_envelope(response, 401)
    response = await client.post("/admin/v1/backends", json=EAGLE3, headers=headers)
    assert_envelope(response, 401)
    client.headers["Authorization"] = "Bearer test-admin-token-0123456789abcdef"
    assert (await client.get("/admin/v1/backends")).json()["data"] == []


async def test_unknown_route_and_method_are_envelopes(client: httpx.AsyncClient) -> None:
    assert_envelope(await client.get("/admin/v1/nothing-here"), 404)
    assert_envelope(await client.put("/admin/v1/backends"), 405)
