"""Each speculative request's own acceptance, as its engine reported it, on its usage record:
the simulator answers vLLM's `--per-request-spec-decode-metrics` block, the official
`openai` client reads it, and the gateway's ledger keeps the same counts, whole or streamed
(with or without the usage chunk the client may not have asked for). The block is cut out of
the answers of clients that did not ask for it with `x-draftgate-include-speculation`."""

from __future__ import annotations

import time
import uuid
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
    fleet_backend,
    sim_args,
)

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
WAIT_S = 60.0  # a deadline for the ledger's writes, not a wait
MESSAGES = [{"role": "user", "content": "write a short poem about the sea"}]


@pytest.fixture(scope="module")
def gateway(
    start_module_servers: ModuleServerStarter, start_module_gateway: ModuleGatewayStarter
) -> Server:
    fast = ("--time-scale", "20")
    [reporting] = start_module_servers(
        sim_args("--method", "p-eagle", "--per-request-spec-metrics", *fast)
    )
    server, _ = start_module_gateway([fleet_backend("spec-p-eagle", reporting.base_url, "p-eagle")])
    return server


def _record(gateway: Server, request_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        page = httpx.get(
            f"{gateway.base_url}/admin/v1/usage", params={"limit": 1000}, headers=ADMIN
        ).json()["data"]
        found = [r for r in page if r["client_request_id"] == request_id]
        if found:
            return found[0]
        time.sleep(0.1)
    pytest.fail(f"no usage record of {request_id}")


def _client(gateway: Server, request_id: str, include: bool = True) -> openai.OpenAI:
    """A client that asks for the speculative decoding block in its answers (`include`)."""
    headers = {"x-request-id": request_id}
    if include:
        headers["x-draftgate-include-speculation"] = "true"
    return openai.OpenAI(
        base_url=f"{gateway.base_url}/v1", api_key="none", max_retries=0, default_headers=headers
    )


def _same(record: dict[str, Any], block: dict[str, Any]) -> None:
    counts = (record["spec_steps"], record["draft_tokens"], record["accepted_tokens"])
    assert counts == (
        block["num_spec_steps"],
        block["num_draft_tokens"],
        block["num_accepted_draft_tokens"],
    ), record
    assert block["num_spec_steps"] > 0
    assert record["acceptance_length"] == pytest.approx(block["mean_acceptance_length"])


def test_a_whole_answer_records_its_own_acceptance(gateway: Server) -> None:
    request_id = str(uuid.uuid4())
    answer = _client(gateway, request_id).chat.completions.create(
        model=SIM_MODEL, messages=MESSAGES, max_tokens=64
    )
    assert answer.model_extra is not None
    block = answer.model_extra["metrics"]["speculative_decoding"]
    _same(_record(gateway, request_id), block)


def test_a_stream_records_its_own_acceptance_whether_the_client_asked_for_usage(
    gateway: Server,
) -> None:
    asked = str(uuid.uuid4())
    stream = _client(gateway, asked).chat.completions.create(
        model=SIM_MODEL,
        messages=MESSAGES,
        max_tokens=64,
        stream=True,
        stream_options={"include_usage": True},
    )
    last = list(stream)[-1]  # the usage-only chunk, with the request's metrics
    assert last.model_extra is not None
    _same(_record(gateway, asked), last.model_extra["metrics"]["speculative_decoding"])

    unasked = str(uuid.uuid4())
    chunks = list(
        _client(gateway, unasked).chat.completions.create(
            model=SIM_MODEL, messages=MESSAGES, max_tokens=64, stream=True
        )
    )
    assert all(c.usage is None for c in chunks)  # the usage chunk was cut out for this client
    record = _record(gateway, unasked)
    assert record["spec_steps"] > 0
    assert record["draft_tokens"] == 7 * record["spec_steps"]  # K=7 drafts every step
    assert 0 <= record["accepted_tokens"] <= record["draft_tokens"]
    # each step makes one token and its accepted drafts (the last may pass max_tokens)
    assert record["spec_steps"] < record["completion_tokens"]
    assert record["completion_tokens"] <= record["spec_steps"] + record["accepted_tokens"] + 1


def test_a_client_that_did_not_ask_gets_no_block_and_the_ledger_still_has_it(
    gateway: Server,
) -> None:
    whole_id, stream_id = str(uuid.uuid4()), str(uuid.uuid4())
    answer = _client(gateway, whole_id, include=False).chat.completions.create(
        model=SIM_MODEL, messages=MESSAGES, max_tokens=64
    )
    assert answer.model_extra is not None
    assert "metrics" not in answer.model_extra, answer.model_extra
    assert answer.choices[0].message.content
    chunks = list(
        _client(gateway, stream_id, include=False).chat.completions.create(
            model=SIM_MODEL,
            messages=MESSAGES,
            max_tokens=64,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    last = chunks[-1]
    assert last.usage is not None
    assert last.usage.completion_tokens > 0
    assert last.model_extra is not None
    assert "metrics" not in last.model_extra, last.model_extra
    for request_id in (whole_id, stream_id):
        record = _record(gateway, request_id)
        assert record["spec_steps"] > 0, record
        assert record["draft_tokens"] == 7 * record["spec_steps"]
