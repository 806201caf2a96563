"""A backend is free again the moment its answer is read, before the client has it.

An agent's loop (or a chat client) sends a conversation's next turn the moment the last one
arrives. If the gateway still counted the last turn in flight on its backend, a pool at rest
would see that backend one request past its share, and cache affinity would send the turn
elsewhere, away from its cached prefix. The gateway runs in process here (its real app and
relay, on SQLite) in front of a real simulator; its ASGI `send` is watched, so the check
reads the backend's count at the exact moment the last of the answer leaves for the client.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.app import create_app
from gateway.settings import Settings
from tests.conftest import ADMIN_TOKEN
from tests.e2e.conftest import SIM_MODEL, Server, draftgate_env, sim_args

BACKEND = "sim-occupancy"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_the_backend_is_free_when_the_last_of_the_answer_leaves(
    start_server: Callable[..., Server], tmp_path: Path, stream: bool
) -> None:
    sim = start_server(*sim_args("--time-scale", "20"), env=draftgate_env())
    settings = Settings(
        database_url=f"sqlite:///{tmp_path}/draftgate.db",
        admin_token=ADMIN_TOKEN,
        require_api_key=False,
    )
    app = create_app(settings)
    in_flight_at_last_byte: list[int] = []

    async def watched(scope: Any, receive: Any, send: Any) -> None:
        async def sending(message: dict[str, Any]) -> None:
            last = message["type"] == "http.response.body" and not message.get("more_body")
            if last and scope["path"].startswith("/v1/chat"):
                states = app.state.components.registry.states
                in_flight_at_last_byte.append(states[BACKEND].in_flight)
            await send(message)

        await app(scope, receive, sending)

    body = {"name": BACKEND, "url": sim.base_url, "model": SIM_MODEL, "method": "plain", "k": 0}
    chat = {
        "model": SIM_MODEL,
        "messages": [{"role": "user", "content": "the same opening question"}],
        "max_tokens": 8,
        "stream": stream,
    }
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=watched),
            base_url="http://localhost",
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        ) as client,
    ):
        assert (await client.post("/admin/v1/backends", json=body)).status_code == 201
        for _ in range(600):  # until the relay's snapshot serves the model (a deadline)
            if (await client.get("/v1/models")).json()["data"]:
                break
            await asyncio.sleep(0.05)
        for _ in range(3):
            answer = await client.post("/v1/chat/completions", json=chat)
            assert answer.status_code == 200, answer.text
            assert answer.headers["x-draftgate-backend"] == BACKEND
    # Counted in flight from when it was sent until its whole answer was read: at the last
    # byte to the client, none (it was 1 there before: a next turn found its backend busy).
    assert in_flight_at_last_byte == [0, 0, 0]
