"""Every request accounted: the Responses API (plain and streamed) through the real gateway
and simulator with the official `openai` client, and a ledger that bad usage values from a
backend cannot stop, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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
    fleet_backend,
    gateway_env,
    metric_value,
    sim_args,
    spawn_server,
    write_fleet,
)

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
WAIT_S = 60.0  # a deadline for the ledger's writes, not a wait


def _until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(what)
        time.sleep(0.1)


def _records(gateway: Server, ids: set[str]) -> dict[str, dict[str, Any]]:
    """The usage records of these client request ids, once all are written."""
    found: dict[str, dict[str, Any]] = {}

    def written() -> bool:
        params: dict[str, str | int] = {"limit": 1000}
        page = httpx.get(f"{gateway.base_url}/admin/v1/usage", params=params, headers=ADMIN)
        found.update({r["client_request_id"]: r for r in page.json()["data"]})
        return ids <= found.keys()

    _until(written, f"usage records of {sorted(ids - found.keys())} were not written")
    return {i: found[i] for i in ids}


def _counted_exactly(stack: Server, seen: dict[str, tuple[int, int]]) -> dict[str, Any]:
    """The records of `seen` (request id: the prompt and completion tokens the client saw),
    each with those tokens and a cost."""
    records = _records(stack, set(seen))
    for rid, (prompt, completion) in seen.items():
        r = records[rid]
        assert (r["prompt_tokens"], r["completion_tokens"]) == (prompt, completion), r
        assert completion > 0
        assert r["cost_usd"] > 0
    return records


@pytest.fixture(scope="module")
def stack(
    start_module_servers: ModuleServerStarter, start_module_gateway: ModuleGatewayStarter
) -> Server:
    [sim] = start_module_servers(sim_args("--time-scale", "20"))
    price = {"gpu_type": "B200", "usd_per_gpu_hour": 6.0, "source": "test", "date": "2026-11-01"}
    gateway, _ = start_module_gateway([fleet_backend("r-plain", sim.base_url)])
    created = httpx.post(f"{gateway.base_url}/admin/v1/prices", json=price, headers=ADMIN)
    assert created.status_code == 201, created.text
    return gateway


def _client(gateway: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key="none", max_retries=0)


def test_responses_api_traffic_is_counted_with_exact_tokens_and_cost(stack: Server) -> None:
    with _client(stack) as client:
        seen = _responses(client)
    records = _counted_exactly(stack, seen)
    for r in records.values():
        assert r["baseline_cost_usd"] == pytest.approx(r["cost_usd"])  # plain: its own baseline
    savings = httpx.get(
        f"{stack.base_url}/admin/v1/savings", params={"group_by": "model"}, headers=ADMIN
    ).json()["data"]
    [row] = [s for s in savings if s["model"] == SIM_MODEL]
    assert row["completion_tokens"] >= sum(c for _, c in seen.values())
    assert row["cost_usd"] >= sum(r["cost_usd"] for r in records.values()) * (1 - 1e-9)


def _responses(client: openai.OpenAI) -> dict[str, tuple[int, int]]:
    """One plain and one streamed Responses request: their ids and the usage each saw."""
    seen: dict[str, tuple[int, int]] = {}
    plain_id = uuid.uuid4().hex
    response = client.responses.create(
        model=SIM_MODEL, input="What is speculative decoding?", max_output_tokens=40,
        extra_headers={"x-request-id": plain_id},
    )  # fmt: skip
    assert response.usage is not None
    seen[plain_id] = (response.usage.input_tokens, response.usage.output_tokens)
    streamed_id = uuid.uuid4().hex
    with client.responses.stream(
        model=SIM_MODEL, input="And why does it pay at low load?", max_output_tokens=40,
        extra_headers={"x-request-id": streamed_id},
    ) as stream:  # fmt: skip
        deltas = sum(1 for event in stream if event.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert deltas > 0
    assert final.usage is not None
    seen[streamed_id] = (final.usage.input_tokens, final.usage.output_tokens)
    return seen


def test_messages_api_traffic_is_counted_with_exact_tokens_and_cost(stack: Server) -> None:
    """Anthropic-style `/v1/messages`, whole and streamed (vLLM 0.32's event names: the
    final usage rides on `message_delta`, before `message_stop`)."""
    url = f"{stack.base_url}/v1/messages"
    body = {"model": SIM_MODEL, "max_tokens": 24, "system": "Be brief.",
            "messages": [{"role": "user", "content": "What is a drafter?"}]}  # fmt: skip
    seen: dict[str, tuple[int, int]] = {}
    with httpx.Client(timeout=60.0) as http:
        whole_id = uuid.uuid4().hex
        reply = http.post(url, json=body, headers={"x-request-id": whole_id})
        assert reply.status_code == 200, reply.text
        message = reply.json()
        assert message["type"] == "message"
        assert message["content"][0]["text"]
        seen[whole_id] = (message["usage"]["input_tokens"], message["usage"]["output_tokens"])
        streamed_id = uuid.uuid4().hex
        streamed = http.post(
            url, json={**body, "stream": True}, headers={"x-request-id": streamed_id}
        )
        events = [e.split("\n", 1) for e in streamed.text.strip().split("\n\n")]
    names = [name.removeprefix("event: ") for name, _ in events]
    assert names[0] == "message_start"
    assert names[-2:] == ["message_delta", "message_stop"]
    assert "[DONE]" not in streamed.text
    usage = json.loads(events[-2][1].removeprefix("data: "))["usage"]
    seen[streamed_id] = (usage["input_tokens"], usage["output_tokens"])
    _counted_exactly(stack, seen)


@pytest.mark.parametrize(
    ("options", "every_chunk", "final"),
    [
        (None, False, False),
        ({"include_usage": True}, False, True),
        ({"include_usage": True, "continuous_usage_stats": True}, True, True),
    ],
)
def test_streams_carry_the_usage_the_client_asked_for(
    stack: Server, options: dict[str, bool] | None, every_chunk: bool, final: bool
) -> None:
    """The gateway asks the backend for usage on every chunk (to count a stream cut short);
    the client sees only what it asked for, and the ledger the exact count either way."""
    rid = uuid.uuid4().hex
    extra = {"ignore_eos": True} | ({"stream_options": options} if options else {})
    with _client(stack) as client:
        chunks = list(
            client.chat.completions.create(
                model=SIM_MODEL, messages=[{"role": "user", "content": "count"}], max_tokens=16,
                stream=True, extra_body=extra, extra_headers={"x-request-id": rid},
            )
        )  # fmt: skip
    content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert content
    assert all((c.usage is not None) is every_chunk for c in content)
    usage_only = [c for c in chunks if not c.choices]
    assert len(usage_only) == int(final)
    record = _records(stack, {rid})[rid]
    assert record["completion_tokens"] == 16
    if final:
        assert usage_only[0].usage is not None
        assert usage_only[0].usage.completion_tokens == 16


# --- a backend answering whatever usage a test sets -------------------------------------

BAD_VALUES: list[Any] = [1e30, 2**70, -5, 1.5, "12", None, True, float("nan"), [3], {"n": 1}]


class EchoBackend:
    """A vLLM-like chat backend on loopback whose answers carry `usage_value` as both counts."""

    def __init__(self) -> None:
        self.usage_value: Any = 7
        backend = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                if self.path == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": SIM_MODEL}]})
                elif self.path == "/health":
                    self._send(200, None)
                else:
                    self._send(404, {"error": {"message": "not found"}})

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", "0")))
                value = backend.usage_value
                usage = {"prompt_tokens": value, "completion_tokens": value, "total_tokens": value}
                message = {"role": "assistant", "content": "ok"}
                choice = {"index": 0, "message": message, "finish_reason": "stop"}
                answer = {"id": "x", "object": "chat.completion", "created": 0,
                          "model": SIM_MODEL, "choices": [choice], "usage": usage}  # fmt: skip
                self._send(200, answer)

            def _send(self, status: int, body: object) -> None:
                data = b"" if body is None else json.dumps(body).encode()  # NaN as NaN: bad JSON
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def echo() -> Iterator[EchoBackend]:
    backend = EchoBackend()
    try:
        yield backend
    finally:
        backend.close()


def test_bad_usage_values_never_stop_the_ledger(
    echo: EchoBackend, database_url: str, tmp_path: Path
) -> None:
    fleet = write_fleet(tmp_path / "fleet.yaml", [fleet_backend("echo", echo.url)])
    gateway = spawn_server(("gateway",), gateway_env(database_url, fleet), tmp_path)
    try:
        gateway.wait_healthy()
        body = {"model": SIM_MODEL, "messages": [{"role": "user", "content": "hi"}]}
        bad_ids, good_ids = [], []
        with httpx.Client(base_url=gateway.base_url, timeout=30) as http:
            for value in BAD_VALUES:
                echo.usage_value = value
                rid = uuid.uuid4().hex
                response = http.post("/v1/chat/completions", json=body,
                                     headers={"x-request-id": rid})  # fmt: skip
                assert response.status_code == 200, (value, response.text)
                bad_ids.append(rid)
            echo.usage_value = 7
            for _ in range(10):
                rid = uuid.uuid4().hex
                response = http.post("/v1/chat/completions", json=body,
                                     headers={"x-request-id": rid})  # fmt: skip
                assert response.status_code == 200, response.text
                good_ids.append(rid)
        records = _records(gateway, set(bad_ids) | set(good_ids))
        for rid in good_ids:  # every good request after the bad ones, exactly
            assert (records[rid]["prompt_tokens"], records[rid]["completion_tokens"]) == (7, 7)
        for rid, value in zip(bad_ids, BAD_VALUES, strict=True):  # recorded, the value as 0
            assert records[rid]["completion_tokens"] == 0, (value, records[rid])
        # Set aside and counted: both counts of each value but None (no count) and NaN (the
        # body is not JSON at all, so it has no usage to reject).
        rejected = metric_value(gateway.base_url, "draftgate_usage_values_rejected_total")
        assert rejected == 2 * (len(BAD_VALUES) - 2)
        assert gateway.process.poll() is None
    finally:
        gateway.close()
    assert "Traceback" not in gateway.output(), gateway.output()[-3000:]
