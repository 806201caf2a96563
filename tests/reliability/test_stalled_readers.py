"""Scenario 11: clients that stop reading their streams.

A client that sends a streaming request and then reads nothing blocks the gateway's writes
to it, and with them the upstream connection the relay reads from. 64 such clients, on a key
allowed 8 requests in flight, beside good traffic on another key, through a 16-connection
relay pool: the key's 9th request on is a 429, each admitted stall is cut once the client
has left the write buffer full for DRAFTGATE_CLIENT_WRITE_TIMEOUT_S (recorded as
`client_stalled`, its upstream request closed), and the good traffic is served throughout.
"""

from __future__ import annotations

import asyncio
import json
import socket
import statistics
import time
import uuid
from collections import Counter

import httpx

from tests.e2e.conftest import metric_value, query_rows
from tests.reliability.conftest import (
    ADMIN_TOKEN,
    Outcome,
    Processes,
    Server,
    connections_to,
    fleet_backend,
    stream_body,
    stream_once,
)

MODEL = "reliability/stalled-readers"
POOL = 16  # DRAFTGATE_UPSTREAM_MAX_CONNECTIONS
STALLED = 64
KEY_CONCURRENCY = 8  # the stalling key's max_concurrent_requests
WRITE_TIMEOUT_S = 2
GOOD_REQUESTS, GOOD_CONCURRENCY = 48, 4
# Tokens a stream may carry before its reader, who read none, is cut: the buffers between
# the gateway and it (64 KiB asyncio, 128 KiB kernel, 4 KiB the reader's) hold about 1,300
# events, and the write timeout lets a few hundred more through (measured: 659; before the
# send buffer was bounded, 10,957 over 27.6 s).
STALL_TOKENS_AT_MOST = 5_000
WAIT_S = 60.0  # for anything that must happen eventually: ample on a busy machine
STALL_BODY = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "an answer nobody reads"}],
    "max_tokens": 200_000,  # far more than the buffers between us and the client hold
    "ignore_eos": True,
    "stream": True,
}


def create_key(gateway: Server, name: str, **limits: int) -> str:
    """A key, once the gateway's registry knows it."""
    with gateway.client(ADMIN_TOKEN) as admin:
        response = admin.post("/admin/v1/keys", json={"name": name} | limits)
    assert response.status_code == 201, response.text
    secret: str = response.json()["key"]
    deadline = time.monotonic() + WAIT_S
    headers = {"Authorization": f"Bearer {secret}"}
    while httpx.get(f"{gateway.base_url}/v1/models", headers=headers).status_code != 200:
        assert time.monotonic() < deadline, "the gateway never learnt the new key"
        time.sleep(0.1)
    return secret


def stalled_reader(port: int, key: str, request_id: str) -> socket.socket:
    """Send a streaming request on a socket with a tiny receive buffer and never read it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    body = json.dumps(STALL_BODY).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
        f"authorization: Bearer {key}\r\nx-request-id: {request_id}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    return sock


async def good_traffic(gateway: Server, key: str) -> list[Outcome]:
    """GOOD_REQUESTS short streams, GOOD_CONCURRENCY at a time, read to their end."""
    gate = asyncio.Semaphore(GOOD_CONCURRENCY)
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=gateway.base_url, headers=headers, timeout=60) as http:

        async def one() -> Outcome:
            async with gate:
                return await stream_once(http, stream_body(MODEL, 32), "good")

        return list(await asyncio.gather(*(one() for _ in range(GOOD_REQUESTS))))


def outcomes_of(database_url: str, prefix: str, count: int) -> Counter[tuple[str, int]]:
    """Until `count` records of request ids starting with `prefix` are written: their
    (outcome, status) counts."""
    deadline = time.monotonic() + WAIT_S
    while True:
        rows = query_rows(
            database_url,
            "SELECT outcome, status_code FROM usage_records WHERE client_request_id LIKE :p",
            p=f"{prefix}%",
        )
        if len(rows) >= count or time.monotonic() > deadline:
            return Counter((r["outcome"], r["status_code"]) for r in rows)
        time.sleep(0.2)


async def test_stalled_readers_are_cut_and_bounded_by_their_key(
    database_url: str, processes: Processes
) -> None:
    sim = processes.sim("--time-scale", "100", "--max-model-len", "1000000", model=MODEL)
    gateway = processes.gateway(
        database_url,
        [fleet_backend("stalled-1", sim.base_url, model=MODEL)],
        REQUIRE_API_KEY="true",
        UPSTREAM_MAX_CONNECTIONS=str(POOL),
        CLIENT_WRITE_TIMEOUT_S=str(WRITE_TIMEOUT_S),
        REGISTRY_REFRESH_S="0.2",
    )
    stalling = create_key(gateway, "stalling", max_concurrent_requests=KEY_CONCURRENCY)
    good = create_key(gateway, "good")
    pid = gateway.process.pid
    before = median_s(await good_traffic(gateway, good))
    baseline = connections_to(pid, [sim.port])

    prefix = f"stall-{uuid.uuid4().hex[:8]}-"
    started = time.monotonic()
    sockets = [stalled_reader(gateway.port, stalling, f"{prefix}{i}") for i in range(STALLED)]
    try:
        during = await good_traffic(gateway, good)
        stalled = outcomes_of(database_url, prefix, STALLED)
        cut_after_s = time.monotonic() - started
        deadline = time.monotonic() + WAIT_S
        while (upstream := connections_to(pid, [sim.port])) > baseline + 2:
            assert time.monotonic() < deadline, f"{upstream} upstream connections stay open"
            await asyncio.sleep(0.1)
    finally:
        for sock in sockets:
            sock.close()
    print(
        f"\nscenario 11 stalled readers: {STALLED} on a key allowed {KEY_CONCURRENCY} in "
        f"flight, pool {POOL}, write timeout {WRITE_TIMEOUT_S}s: records {dict(stalled)}, all "
        f"written after {cut_after_s:.1f}s; good traffic {Counter(o.kind for o in during)}, "
        f"median latency before={before * 1000:.0f}ms during={median_s(during) * 1000:.0f}ms; "
        f"upstream connections before={baseline} after={upstream}"
    )
    assert [o.kind for o in during] == ["ok"] * GOOD_REQUESTS
    assert stalled == {
        ("client_stalled", 499): KEY_CONCURRENCY,
        ("rejected", 429): STALLED - KEY_CONCURRENCY,
    }
    cut = metric_value(gateway.base_url, "draftgate_clients_cut_total", model=MODEL)
    assert cut == KEY_CONCURRENCY


def median_s(outcomes: list[Outcome]) -> float:
    return statistics.median(o.latency_s for o in outcomes)


def test_a_stalled_reader_is_cut_seconds_after_its_last_read(
    database_url: str, processes: Processes
) -> None:
    """At a real generation speed: the gateway's send buffer per connection is bounded, so
    one client that reads nothing is cut about `CLIENT_WRITE_TIMEOUT_S` after it stopped,
    having been sent a few thousand tokens at most. Before, the kernel's buffer grew to
    megabytes and the stream ran on until it was full (tens of thousands of tokens) before
    the timeout even started."""
    sim = processes.sim("--max-model-len", "1000000", model=MODEL)  # real time
    gateway = processes.gateway(
        database_url,
        [fleet_backend("stalled-1", sim.base_url, model=MODEL)],
        REQUIRE_API_KEY="true",
        CLIENT_WRITE_TIMEOUT_S=str(WRITE_TIMEOUT_S),
        REGISTRY_REFRESH_S="0.2",
    )
    key = create_key(gateway, "stalling")
    request_id = f"one-stall-{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    sock = stalled_reader(gateway.port, key, request_id)
    try:
        deadline = time.monotonic() + 300  # a deadline, not a wait: the old gateway took 69 s
        sql = "SELECT * FROM usage_records WHERE client_request_id = :rid"
        while not (rows := query_rows(database_url, sql, rid=request_id)):
            assert time.monotonic() < deadline, "the stalled reader was never cut"
            time.sleep(0.2)
        cut_after_s = time.monotonic() - started
    finally:
        sock.close()
    record = rows[0]
    print(f"\none stalled reader at real speed: cut after {cut_after_s:.1f} s (write timeout "
          f"{WRITE_TIMEOUT_S} s), {record['completion_tokens']} tokens generated, "
          f"{record['outcome']} {record['status_code']}")  # fmt: skip
    assert (record["outcome"], record["status_code"]) == ("client_stalled", 499)
    assert record["completion_tokens"] < STALL_TOKENS_AT_MOST, record["completion_tokens"]
