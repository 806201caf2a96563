"""A relayed request leaves nothing for the garbage collector.

Everything a request makes must be freed by reference counting the moment it ends. An object
caught in a reference cycle waits for a collection instead, and once such garbage reaches the
oldest generation, the full pass that frees it stops the event loop, and every stream in
flight, for as long as it walks the heap: 80-140 ms under load before this was fixed
(bench/README.md).

Here a real gateway (its server protocol and the CLI's server, in this process so its heap
can be read) relays streamed and whole chat completions from a real simulator to the official
`openai` client, with the collector off; then no request's objects may still be alive.
"""

from __future__ import annotations

import asyncio
import gc
import time
from pathlib import Path

import openai
from openai.types.chat import ChatCompletionMessageParam

from gateway.app import create_app
from gateway.cli.serve import Server, server_config
from gateway.relay.departure import Departure
from gateway.relay.exchange import Exchange
from gateway.settings import Settings
from tests.conftest import ADMIN_TOKEN
from tests.e2e.conftest import (
    SIM_MODEL,
    ServerStarter,
    draftgate_env,
    fleet_backend,
    free_port,
    sim_args,
    write_fleet,
)

REQUESTS = 12
WAIT_S = 30.0  # for the last request's accounting to finish after its client has read it


def _alive() -> list[object]:
    return [o for o in gc.get_objects() if isinstance(o, Exchange | Departure)]


async def test_a_finished_request_leaves_no_reference_cycle(
    start_server: ServerStarter, tmp_path: Path, database_url: str
) -> None:
    sim = start_server(*sim_args("--time-scale", "50"), env=draftgate_env())
    fleet = write_fleet(tmp_path / "fleet.yaml", [fleet_backend("heap-1", sim.base_url)])
    port = free_port()
    settings = Settings(
        database_url=database_url,
        admin_token=ADMIN_TOKEN,
        fleet=fleet,
        port=port,
        require_api_key=False,
    )
    server = Server(server_config(settings, create_app(settings)))
    serving = asyncio.ensure_future(server.serve())
    gc.disable()  # what is not freed by reference counting stays, for the test to find
    try:
        deadline = time.monotonic() + WAIT_S
        while not server.started:
            assert not serving.done(), "the gateway stopped during start-up"
            assert time.monotonic() < deadline, "the gateway did not start"
            await asyncio.sleep(0.05)
        client = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0
        )
        async with client:
            for i in range(REQUESTS):
                messages: list[ChatCompletionMessageParam] = [
                    {"role": "user", "content": f"request {i}"}
                ]
                if i % 2:
                    whole = await client.chat.completions.create(
                        model=SIM_MODEL,
                        messages=messages,
                        max_tokens=8,
                    )
                    assert whole.choices[0].message.content
                    continue
                stream = await client.chat.completions.create(
                    model=SIM_MODEL,
                    messages=messages,
                    max_tokens=8,
                    stream=True,
                )
                chunks = [chunk async for chunk in stream]
                assert any(c.choices and c.choices[0].delta.content for c in chunks)
        # The last request settles just after its client has read it: wait for that.
        while alive := _alive():
            message = f"{len(alive)} request objects outlive their requests: a cycle"
            assert time.monotonic() < deadline, message
            await asyncio.sleep(0.05)
    finally:
        gc.unfreeze()  # what the server's start-up froze is this test process's to collect
        gc.enable()
        server.should_exit = True
        await serving
