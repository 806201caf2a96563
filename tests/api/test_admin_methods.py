"""GET /admin/v1/methods (the method catalog) and POST /admin/v1/methods/render."""

from __future__ import annotations

import shlex
from typing import Any

import httpx
import pytest
import yaml
from fastapi import FastAPI

from backends.compose import vllm_service
from backends.methods import METHOD_IDS, make_spec, render_vllm_args
from tests.api.test_admin_backends import assert_envelope

MODEL = "Qwen/Qwen3-8B"
DRAFTER = "RedHatAI/Qwen3-8B-speculator.eagle3"
ALL_INTERFACES = "0.0.0.0"  # noqa: S104  (vLLM's address inside its container)
SCHEDULE = [[1, 8, 3], [9, 64, 1], [65, 256, 0]]


async def test_methods_list_the_catalog_with_what_each_needs(client: httpx.AsyncClient) -> None:
    response = await client.get("/admin/v1/methods")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == list(METHOD_IDS)  # catalog order, every method
    by_id = {m["id"]: m for m in body["data"]}
    needs = {
        i: (m["speculative"], m["k_required"], m["drafter_required"], m["drafter_allowed"])
        for i, m in by_id.items()
    }
    assert needs["plain"] == (False, False, False, False)
    assert needs["eagle3"] == (True, True, True, True)
    assert needs["dspark"] == (True, True, False, True)  # the target may ship its drafter
    assert needs["ngram"] == (True, True, False, False)
    assert needs["suffix"] == (True, False, False, False)  # vLLM fills in K
    assert [i for i, m in by_id.items() if m["adaptive_verification"]] == ["dspark"]
    assert (by_id["p-eagle"]["vllm_method"], by_id["p-eagle"]["parallel"]) == ("eagle3", True)
    assert all(m["description"] for m in body["data"])


async def test_render_matches_vllm_serve_and_the_compose_service(
    client: httpx.AsyncClient,
) -> None:
    request = {
        "model": MODEL,
        "method": "eagle3",
        "k": 3,
        "drafter": DRAFTER,
        "gpu_count": 2,
        "first_gpu": 4,
        "speculative_options": {"num_speculative_tokens_per_batch_size": SCHEDULE},
    }
    response = await client.post("/admin/v1/methods/render", json=request)
    assert response.status_code == 200, response.text
    body = response.json()
    spec = make_spec("eagle3", 3, DRAFTER, k_per_batch_size=SCHEDULE)
    argv = render_vllm_args(MODEL, spec, host=ALL_INTERFACES, port=8000)
    assert body["argv"] == argv
    assert body["command"] == shlex.join(argv)
    assert body["speculative_config"] == {
        "method": "eagle3",
        "model": DRAFTER,
        "num_speculative_tokens": 3,
        "num_speculative_tokens_per_batch_size": SCHEDULE,
    }
    service: dict[str, Any] = vllm_service(MODEL, spec, gpu_count=2, first_gpu=4)
    assert body["compose_service"] == service | {"ports": ["127.0.0.1:8000:8000"]}
    [gpus] = body["compose_service"]["deploy"]["resources"]["reservations"]["devices"]
    assert gpus["device_ids"] == ["4", "5"]
    assert body["compose_service"]["image"] == "vllm/vllm-openai:v0.32.0"
    compose = yaml.safe_load(body["compose_yaml"])
    assert compose == {"services": {"vllm": body["compose_service"]}, "volumes": {"hf-cache": {}}}
    assert (body["model"], body["method"], body["k"], body["drafter"]) == (
        MODEL,
        "eagle3",
        3,
        DRAFTER,
    )


async def test_render_plain_has_no_speculative_config_and_changes_nothing(
    client: httpx.AsyncClient,
) -> None:
    request = {"model": MODEL, "method": "plain", "port": 9000}
    body = (await client.post("/admin/v1/methods/render", json=request)).json()
    assert body["speculative_config"] is None
    assert body["argv"] == ["vllm", "serve", MODEL, "--host", ALL_INTERFACES, "--port", "9000"]
    assert body["compose_service"]["ports"] == ["127.0.0.1:9000:9000"]
    [gpus] = body["compose_service"]["deploy"]["resources"]["reservations"]["devices"]
    assert gpus["device_ids"] == ["0"]  # the default: one GPU, the host's first
    assert (await client.get("/admin/v1/audit")).json()["data"] == []
    assert (await client.get("/admin/v1/models")).json()["data"] == []


@pytest.mark.parametrize(
    ("request_body", "param"),
    [
        ({"method": "eagle3", "k": 3}, "drafter"),  # eagle3 needs a drafter model
        ({"method": "ngram", "k": 3, "drafter": DRAFTER}, "drafter"),  # ngram has none
        ({"method": "plain", "k": 3}, "k"),
        ({"method": "dflash", "drafter": DRAFTER}, "k"),  # K is not optional for dflash
        (
            {
                "method": "eagle3",
                "k": 3,
                "drafter": DRAFTER,
                "speculative_options": {"num_speculative_tokens_per_batch_size": [[1, 8, 5]]},
            },
            "speculative_options",
        ),  # a schedule's K above num_speculative_tokens
        ({"method": "medusa", "k": 3}, "method"),
        ({"method": "plain", "gpu_count": 0}, "gpu_count"),
        ({"method": "plain", "first_gpu": -1}, "first_gpu"),
    ],
)
async def test_render_refuses_an_invalid_spec_naming_the_field(
    client: httpx.AsyncClient, request_body: dict[str, Any], param: str
) -> None:
    response = await client.post("/admin/v1/methods/render", json={"model": MODEL, **request_body})
    assert_envelope(response, 422, param)


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/admin/v1/methods", None),
        ("POST", "/admin/v1/methods/render", {"model": MODEL, "method": "plain"}),
    ],
)
async def test_methods_need_the_admin_token(
    app: FastAPI, method: str, path: str, body: dict[str, Any] | None
) -> None:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway.test") as anonymous:
        response = await anonymous.request(method, path, json=body)
    assert_envelope(response, 401)
    assert response.json()["error"]["type"] == "authentication_error"
