"""Reliability tier: real gateway and simulator processes, streaming load, process figures.

The e2e tier's process fixtures are re-exported here; the rest is what the reliability
scenarios share: a streaming load generator that classifies how each request ended, the
gateway's resident memory, open descriptors and upstream connections read from /proc, and
usage-record counts per client request id.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import Counter
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import (  # noqa: F401  (fixtures are found by their import here)
    ADMIN_TOKEN,
    DRAFTGATE,
    SIM_MODEL,
    Server,
    ServerStarter,
    draftgate_env,
    fleet_backend,
    free_port,
    gateway_env,
    metric_value,
    query_rows,
    sim_args,
    spawn_server,
    start_module_servers,
    start_server,
    write_fleet,
)

DONE = b"data: [DONE]"
LOAD_TIMEOUT_S = 60.0  # per request: generous on a busy machine


@dataclass
class Outcome:
    """How one streaming request ended, seen by its client."""

    request_id: str
    status: int | None = None  # None: no response head (connection refused, reset...)
    backend: str | None = None
    chunks: int = 0  # SSE data events received, [DONE] excluded
    done: bool = False  # saw `data: [DONE]`
    error_event: bool = False  # saw an SSE `data: {"error": ...}` event
    error_message: str | None = None  # that event's message
    exception: str | None = None
    latency_s: float = 0.0
    started_at: float = 0.0  # time.monotonic() when sent

    @property
    def kind(self) -> str:
        """ok, failed (never streamed), broken_with_error (an error event), or truncated."""
        if self.status == 200 and self.done and not self.error_event and self.exception is None:
            return "ok"
        if self.error_event and self.done:
            return "broken_with_error"
        if self.status != 200 or self.chunks == 0:
            return "failed"
        return "truncated"


@dataclass
class LoadResult:
    """Every outcome of a load run."""

    outcomes: list[Outcome] = field(default_factory=list)

    def count(self, kind: str) -> int:
        """How many requests ended as `kind`."""
        return sum(1 for o in self.outcomes if o.kind == kind)

    @property
    def request_ids(self) -> list[str]:
        """The client-side ids of every request sent."""
        return [o.request_id for o in self.outcomes]

    def by_backend(self) -> Counter[str | None]:
        """Requests per backend that answered (None: none did)."""
        return Counter(o.backend for o in self.outcomes)

    def summary(self) -> str:
        """One line of figures."""
        kinds = {k: self.count(k) for k in ("ok", "failed", "broken_with_error", "truncated")}
        return f"sent={len(self.outcomes)} " + " ".join(f"{k}={v}" for k, v in kinds.items())


def stream_body(model: str, max_tokens: int = 32) -> dict[str, object]:
    """A streaming chat request that generates exactly `max_tokens` tokens."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": f"reliability {uuid.uuid4().hex[:8]}"}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
    }


async def stream_once(
    http: httpx.AsyncClient,
    body: dict[str, object],
    prefix: str = "rel",
    outcome: Outcome | None = None,
) -> Outcome:
    """Send one streaming chat request and read it to its end, never raising.

    A given `outcome` is filled in as the stream goes, so a caller can watch its progress.
    """
    outcome = outcome or Outcome(request_id=f"{prefix}-{uuid.uuid4().hex[:16]}")
    started, outcome.started_at = time.perf_counter(), time.monotonic()
    headers = {"x-request-id": outcome.request_id}
    try:
        async with http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
            outcome.status, outcome.backend = r.status_code, r.headers.get("x-draftgate-backend")
            async for line in r.aiter_lines():
                _read_event(outcome, line.encode())
    except httpx.HTTPError as exc:
        outcome.exception = type(exc).__name__
    outcome.latency_s = time.perf_counter() - started
    return outcome


def _read_event(outcome: Outcome, line: bytes) -> None:
    if line == DONE:
        outcome.done = True
    elif line.startswith(b'data: {"error"'):
        outcome.error_event = True
        outcome.error_message = json.loads(line[6:])["error"].get("message")
    elif line.startswith(b"data: "):
        outcome.chunks += 1


async def run_streaming_load(
    base_url: str,
    model: str,
    *,
    concurrency: int,
    duration_s: float,
    max_tokens: int = 32,
    prefix: str = "rel",
    stop: asyncio.Event | None = None,
) -> LoadResult:
    """`concurrency` clients each sending streaming requests back to back for `duration_s`.

    Setting `stop` ends the run earlier: no client starts another request after it.
    """
    result = LoadResult()
    deadline = time.monotonic() + duration_s
    stop = stop or asyncio.Event()
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    timeout = httpx.Timeout(LOAD_TIMEOUT_S, connect=10.0)

    async def client_loop(http: httpx.AsyncClient) -> None:
        while time.monotonic() < deadline and not stop.is_set():
            outcome = await stream_once(http, stream_body(model, max_tokens), prefix)
            result.outcomes.append(outcome)

    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=timeout) as http:
        await asyncio.gather(*(client_loop(http) for _ in range(concurrency)))
    return result


# --- What a process holds, read from /proc. ---


def rss_bytes(pid: int) -> int:
    """Resident memory of process `pid`."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def open_fds(pid: int) -> int:
    """File descriptors process `pid` holds open."""
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = fd.readlink().as_posix()
        except OSError:  # closed while listing
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


async def wait_for_health(gateway: str, backend: str, value: int, deadline: float) -> None:
    """Until the gateway's health gauge of `backend` reads `value` (fail at `deadline`)."""
    while metric_value(gateway, "draftgate_backend_healthy", backend=backend) != value:
        if time.monotonic() > deadline:
            pytest.fail(f"{backend}'s health never read {value}")
        await asyncio.sleep(0.1)


def describe_fds(pid: int) -> Counter[str]:
    """Process `pid`'s descriptors by kind, TCP sockets by state and remote port: what a
    failed leak check shows."""
    states = {"01": "ESTABLISHED", "06": "TIME_WAIT", "08": "CLOSE_WAIT", "0A": "LISTEN"}
    tcp = {}
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        remote_port = int(fields[2].split(":")[1], 16)
        tcp[fields[9]] = f"tcp {states.get(fields[3], fields[3])} to :{remote_port}"
    kinds: Counter[str] = Counter()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = fd.readlink().as_posix()
        except OSError:  # closed while listing
            continue
        inode = target[8:-1] if target.startswith("socket:[") else None
        kinds[tcp.get(inode, "socket, not TCP/IPv4") if inode else target.split(":")[0]] += 1
    return kinds


def connections_to(pid: int, ports: Iterable[int]) -> int:
    """TCP connections of process `pid` whose remote end is 127.0.0.1 on one of `ports`."""
    wanted, inodes, count = set(ports), _socket_inodes(pid), 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        remote_port = int(fields[2].split(":")[1], 16)
        if remote_port in wanted and fields[9] in inodes:
            count += 1
    return count


# --- The usage ledger. ---


def usage_counts(database_url: str, prefix: str) -> Counter[str]:
    """Usage records per client request id, for ids starting with `prefix`."""
    rows = query_rows(
        database_url,
        "SELECT client_request_id FROM usage_records WHERE client_request_id LIKE :p",
        p=f"{prefix}%",
    )
    return Counter(r["client_request_id"] for r in rows)


def wait_for_ledger(
    database_url: str, prefix: str, request_ids: Collection[str], timeout_s: float = 20.0
) -> Counter[str]:
    """Poll until every id in `request_ids` has a record; the counts per id then.

    One more flush interval is waited after that, so a duplicate written late is seen too.
    """
    wanted, deadline = set(request_ids), time.monotonic() + timeout_s
    while not wanted <= set(counts := usage_counts(database_url, prefix)):
        if time.monotonic() > deadline:
            missing = len(wanted - set(counts))
            pytest.fail(f"{missing} of {len(wanted)} usage records missing after {timeout_s} s")
        time.sleep(0.2)
    time.sleep(1.0)
    return usage_counts(database_url, prefix)


class Processes:
    """Gateways and simulators started by one test; all stopped at its end."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.started: list[Server] = []

    def sim(self, *options: str, model: str = SIM_MODEL, port: int | None = None) -> Server:
        """A `draftgate sim` serving `model` with `options`, on `port` or a free one; healthy."""
        args = sim_args("--served-model-name", model, *options)
        return self._start(args, draftgate_env(), port)

    def gateway(
        self,
        database_url: str,
        fleet: list[dict[str, object]],
        port: int | None = None,
        wait: bool = True,
        **settings: str,
    ) -> Server:
        """`draftgate gateway` on `database_url` declaring `fleet` (DRAFTGATE_* overrides)."""
        fleet_path = write_fleet(self.log_dir / f"fleet-{uuid.uuid4().hex[:6]}.yaml", fleet)
        env = gateway_env(database_url, fleet_path, **settings)
        return self._start(("gateway",), env, port, wait)

    def _start(
        self, args: tuple[str, ...], env: dict[str, str], port: int | None, wait: bool = True
    ) -> Server:
        server = spawn_server(args, env, self.log_dir, port)
        self.started.append(server)
        if wait:
            server.wait_healthy()
        return server


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    """Start gateways and simulators; every one still running is stopped in teardown."""
    started = Processes(tmp_path)
    try:
        yield started
    finally:
        for server in started.started:
            server.close()
