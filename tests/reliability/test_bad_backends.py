"""One broken backend never stops another's health checks, scrapes or requests.

A backend stored before its URL was validated (credentials in it: the client library
refuses to send there) sits beside good ones. The prober used to die on it, for every
backend, until restart; requests routed to it got a plain-text 500 recorded as "ok".
"""

from __future__ import annotations

import asyncio
import time

import httpx

from gateway.db.session import make_engine, make_sessionmaker, transaction
from gateway.db.tables import Backend
from tests.e2e.conftest import free_port
from tests.reliability.conftest import (
    ADMIN_TOKEN,
    Processes,
    fleet_backend,
    metric_value,
    wait_for_health,
)

MODEL = "reliability/bad-backends"
WAIT_S = 30.0
REQUESTS = 20


def store_broken_backend(database_url: str, url: str) -> None:
    """Write a backend row the admin API would refuse, as an older gateway could have."""
    engine = make_engine(database_url)
    try:
        with transaction(make_sessionmaker(engine)) as session:
            session.add(
                Backend(name="broken", url=url, model=MODEL, method="plain", gpu_type="B200")
            )
    finally:
        engine.dispose()


async def test_a_broken_backend_leaves_the_others_probed_and_served(
    database_url: str, processes: Processes
) -> None:
    good = processes.sim("--time-scale", "50", model=MODEL)
    late_port = free_port()
    fleet = [
        fleet_backend("good-1", good.base_url, model=MODEL),
        fleet_backend("late-1", f"http://127.0.0.1:{late_port}", model=MODEL),
    ]
    gateway = processes.gateway(database_url, fleet, REGISTRY_REFRESH_S="0.2")
    await wait_for_health(
        gateway.base_url, "late-1", 0, time.monotonic() + WAIT_S
    )  # probed: nothing listens there yet
    store_broken_backend(database_url, f"http://user:secret@127.0.0.1:{good.port}")
    with gateway.client(ADMIN_TOKEN) as admin:
        deadline = time.monotonic() + WAIT_S
        while "runtime" not in (admin.get("/admin/v1/backends/broken").json() or {}):
            assert time.monotonic() < deadline, "the gateway never loaded the broken backend"
            await asyncio.sleep(0.1)
        listed = admin.get("/admin/v1/backends")  # a stored row is shown, not re-validated
    assert listed.status_code == 200, listed.text

    # The prober goes on: a backend that comes up after the broken one was loaded is seen.
    processes.sim("--time-scale", "50", model=MODEL, port=late_port)
    await wait_for_health(gateway.base_url, "late-1", 1, time.monotonic() + WAIT_S)
    await wait_for_health(gateway.base_url, "good-1", 1, time.monotonic() + WAIT_S)
    assert metric_value(gateway.base_url, "draftgate_backend_healthy", backend="broken") == 0

    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    async with httpx.AsyncClient(base_url=gateway.base_url, timeout=30.0) as http:
        answers = [
            await http.post("/v1/chat/completions", json=body, headers={"x-request-id": f"bad-{i}"})
            for i in range(REQUESTS)
        ]
    served = [(r.status_code, r.headers.get("x-draftgate-backend")) for r in answers]
    print(
        f"\nbroken backend beside good ones: {served.count((200, 'good-1'))} on good-1, "
        f"{served.count((200, 'late-1'))} on late-1, others {[s for s in served if s[0] != 200]}"
    )
    assert all(status == 200 and backend != "broken" for status, backend in served), served
    assert "secret" not in gateway.output()  # nor is its password in the log
