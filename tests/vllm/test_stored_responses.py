"""Stored responses against real vLLM: two `vllm serve` processes (plain, both serving
`tiny-pool`, each keeping its Responses API responses in its own memory) behind the gateway,
called with the official `openai` client. A later turn, a retrieval or a cancel sent to the
other server is vLLM's own 404, so every one succeeding proves the gateway sent it home; and
the simulator's stored responses and their errors answer as real vLLM's do (its keys among
vLLM's, its errors alike)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.conftest import (
    ModuleGatewayStarter,
    Server,
    draftgate_env,
    fleet_backend,
    sim_args,
    spawn_server,
)
from tests.vllm.conftest import CPU, POOL_KEYS, POOL_MODEL, STORE_RESPONSES, RealServer
from tests.vllm.test_sim_conformance import _keys

pytestmark = pytest.mark.vllm

CONVERSATIONS = 4
TURNS = 3


@pytest.fixture(scope="module")
def gateway(
    vllm_servers: dict[str, RealServer], start_module_gateway: ModuleGatewayStarter
) -> Server:
    pool = [vllm_servers[key] for key in POOL_KEYS]
    backends = [fleet_backend(f"pool-{s.key}", s.url, model=POOL_MODEL, gpu_type=CPU) for s in pool]
    server, _ = start_module_gateway(backends)
    return server


@pytest.fixture(scope="module")
def client(gateway: Server) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key="unused") as sdk:
        yield sdk


def turn(client: openai.OpenAI, text: str, previous: str | None) -> tuple[str, str]:
    raw = client.responses.with_raw_response.create(
        model=POOL_MODEL,
        input=text,
        max_output_tokens=4,
        temperature=0,
        previous_response_id=previous,
    )
    return raw.parse().id, raw.headers["x-draftgate-backend"]


def test_each_conversation_stays_on_the_server_that_holds_it(client: openai.OpenAI) -> None:
    homes = []
    for n in range(CONVERSATIONS):
        previous, home = turn(client, f"conversation {n}", None)
        for later in range(TURNS - 1):
            previous, served = turn(client, f"turn {later}", previous)
            assert served == home
        homes.append(home)
        retrieved = client.responses.with_raw_response.retrieve(previous)
        assert retrieved.headers["x-draftgate-backend"] == home
        assert retrieved.parse().id == previous
        with pytest.raises(openai.BadRequestError, match="Cannot cancel a synchronous response"):
            client.responses.cancel(previous)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_neverstoredanywhere")
    assert len(set(homes)) == len(POOL_KEYS)  # both servers held conversations


def _stored_shapes(base_url: str, model: str) -> dict[str, Any]:
    """Key shapes of a stored response, a continued one and the store's errors."""
    with httpx.Client(base_url=base_url, timeout=60) as http:
        body = {"model": model, "input": "hi", "max_output_tokens": 4}
        made = http.post("/v1/responses", json=body)
        assert made.status_code == 200, made.text
        stored = http.get(f"/v1/responses/{made.json()['id']}")
        later = http.post("/v1/responses", json=body | {"previous_response_id": made.json()["id"]})
        answers = {
            "stored": stored,
            "continued": later,
            "unknown id": http.get("/v1/responses/resp_0123456789abcdef0123456789abcdef"),
            "unknown previous": http.post(
                "/v1/responses", json=body | {"previous_response_id": "resp_nope"}
            ),
            "cancel finished": http.post(f"/v1/responses/{made.json()['id']}/cancel"),
        }
    return {
        name: (answer.status_code, _keys(answer.json()), answer.json().get("error"))
        if answer.status_code >= 400
        else (answer.status_code, _keys(answer.json()))
        for name, answer in answers.items()
    }


def test_the_simulators_store_answers_as_real_vllm(
    vllm_servers: dict[str, RealServer], tmp_path: Path
) -> None:
    options = ("--method", "plain", "--served-model-name", "tiny-plain", "--max-model-len", "512")
    sim = spawn_server(sim_args(*options), draftgate_env(**STORE_RESPONSES), tmp_path)
    try:
        sim.wait_healthy()
        simulated = _stored_shapes(sim.base_url, "tiny-plain")
    finally:
        sim.close()
    real = _stored_shapes(vllm_servers["plain"].url, "tiny-plain")
    for name, answer in real.items():
        assert simulated[name][0] == answer[0], name  # the status
        if len(answer) == 3:  # an error: its type, param and code too
            assert _but_message(simulated[name][2]) == _but_message(answer[2]), name
        else:  # every key the simulator gives, real vLLM gives (vLLM gives more)
            assert _within(simulated[name][1], answer[1]), name


def _but_message(error: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in error.items() if k != "message"}


def _within(shape: Any, wider: Any) -> bool:
    """Whether a key shape is part of another."""
    if isinstance(shape, dict):
        return isinstance(wider, dict) and all(
            k in wider and _within(v, wider[k]) for k, v in shape.items()
        )
    if isinstance(shape, list):
        return (
            isinstance(wider, list)
            and len(shape) <= len(wider)
            and all(_within(v, w) for v, w in zip(shape, wider[: len(shape)], strict=True))
        )
    return True
