"""Gateway overhead: the same load direct to a mock vLLM, through draftgate, through the Rust
vllm-router and through LiteLLM.

Starts bench/mock_upstream.py (one per token delay), `draftgate gateway`, vLLM's Rust router
(`vllm-router`, the yardstick) and the LiteLLM proxy (one worker), the last two each
installed into a virtualenv of its own under --cache-dir on first use, then for each
scenario (non-streamed and streamed chat completions, 0 and 5 ms per token, each concurrency)
runs closed-loop keep-alive clients over raw sockets against each target in turn, alternating
targets round by round so machine noise hits all of them alike. Reports p50/p99 latency and
what the proxy adds to them, throughput relative to direct, the proxy's CPU ms per request
(utime + stime of its process tree from /proc), and wrk's non-streamed req/s as a cross-check.

`--baseline DIR` adds the target `baseline`: the gateway of another checkout (its own
`.venv`, e.g. an earlier commit), so a change is measured against what it changes in one run.
`granian` is this gateway's app served by Granian (Rust HTTP) instead of uvicorn, for
comparison (it lacks the request limits gateway/server/http_limits.py adds to uvicorn's protocol).
`draftgate-wN` is this gateway with N worker processes (`DRAFTGATE_WORKERS=N`); its CPU is
that of the supervisor and every worker. `floor` (`floor-wN`) is bench/floor_relay.py, the
least a Python relay does on the gateway's own stack, one (N) uvicorn process(es): the floor
the gateway's own work sits on. The target `traced` is this gateway with tracing on
(every request sampled, the SDK's default batching), exporting over OTLP/HTTP to
bench/otlp_sink.py on this machine. `keyed` is this gateway requiring API keys, its clients
sending one, and `teams` the same with 10,000 keys in 500 teams, every key and team with
request and token limits and a budget: admission's cost as keys and teams grow.

Run: .venv/bin/python bench/overhead.py
         [--targets direct,draftgate,draftgate-w2,floor,floor-w2,traced,keyed,teams,
                    vllm-router,litellm]
         [--concurrency 1,16,64,256] [--duration 5] [--rounds 2] [--quick] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import NoReturn

import httpx

REPO = Path(__file__).resolve().parent.parent
MODEL = "mock-model"
ALL_TARGETS = (
    "direct", "draftgate", "draftgate-w2", "floor", "floor-w2", "granian", "traced",
    "keyed", "teams", "vllm-router", "litellm",
)  # fmt: skip
WORKERS_TARGET = re.compile(r"draftgate-w(\d+)")  # the gateway with N worker processes
FLOOR_TARGET = re.compile(r"floor(?:-w(\d+))?")  # bench/floor_relay.py, N uvicorn workers
DEFAULT_TARGETS = ("direct", "draftgate", "draftgate-w2", "vllm-router", "litellm")
# Proxies measured beside draftgate, each pip-installed into a virtualenv of its own:
# (what pip installs, the executable it brings).
THIRD_PARTY = {
    "litellm": ("litellm[proxy]", "litellm"),
    "vllm-router": ("vllm-router==0.1.17", "vllm-router"),
    "granian": ("granian==2.8.9", "granian"),  # a server for this gateway, not a proxy
}
REQUEST_TIMEOUT_S = 60.0
Tools = dict[str, Path | str]  # a third-party proxy's executable, or why it is missing
MESSAGES = [{"role": "user", "content": "Write a short note about gateway overhead benchmarks."}]


@dataclass(frozen=True)
class Target:
    """Something to send load to; `pid` is the proxy's process (None for direct)."""

    name: str
    port: int
    pid: int | None
    spans_url: str | None = None  # where the counts of the spans it exported are read
    key: str | None = None  # the API key its requests carry (None: it requires none)

    def auth(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.key}"} if self.key else {}


@dataclass(frozen=True)
class Scenario:
    """One load shape."""

    stream: bool
    token_delay_ms: float
    concurrency: int

    def title(self) -> str:
        mode = "streamed" if self.stream else "non-streamed"
        return f"{mode} chat, {self.token_delay_ms:g} ms/token, c={self.concurrency}"


@dataclass
class Result:
    """What one target did in one scenario, pooled over its rounds."""

    latencies_s: list[float] = field(default_factory=list)
    elapsed_s: float = 0.0  # from the start of each load to its last response
    completed: int = 0
    drain_s: float = 0.0  # how long the proxy kept busy after each load
    proxy_cpu_s: float = 0.0
    upstream_cpu_s: float = 0.0
    errors: int = 0
    first_error: str = ""
    wrk_rps: float | None = None
    wrk_note: str = ""
    spans: int = 0  # spans the OTLP sink received during its rounds

    def rps(self) -> float:
        return self.completed / self.elapsed_s if self.elapsed_s else 0.0

    def percentile_ms(self, q: float) -> float:
        ordered = sorted(self.latencies_s)
        if not ordered:
            return float("nan")
        return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# --- processes ---------------------------------------------------------------------------


class Processes:
    """Every process this benchmark starts, each in its own session, stopped as a group."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.running: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, argv: list[str], env: dict[str, str], cwd: Path) -> int:
        log = (self.log_dir / f"{name}.log").open("wb")
        proc = subprocess.Popen(  # noqa: S603
            argv, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.running[name] = proc
        return proc.pid

    def log_tail(self, name: str, lines: int = 15) -> str:
        path = self.log_dir / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join("    " + line for line in text.splitlines()[-lines:])

    def exited(self, name: str) -> int | None:
        return self.running[name].poll()

    def stop(self, name: str) -> None:
        proc = self.running.pop(name)
        for signum, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signum)
            try:
                proc.wait(wait_s)
                return
            except subprocess.TimeoutExpired:
                print(f"  {name} (pid {proc.pid}) did not stop on {signum.name}", file=sys.stderr)

    def stop_all(self) -> None:
        for name in list(self.running):
            self.stop(name)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_ready(procs: Processes, name: str, url: str, timeout_s: float) -> str | None:
    """None once `url` answers 200, else why not (the process died or time ran out)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (code := procs.exited(name)) is not None:
            return f"{name} exited with {code} during start-up:\n{procs.log_tail(name)}"
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return None
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    return f"{name} did not answer {url} within {timeout_s:.0f} s:\n{procs.log_tail(name)}"


def tree_cpu_s(pid: int | None) -> float:
    """User + system CPU seconds of a process and its live descendants (0 for no process)."""
    if pid is None:
        return 0.0
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # exited while we looked
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        todo.extend(children.get(current, []))
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


# --- targets -----------------------------------------------------------------------------


def start_upstream(procs: Processes, token_delay_ms: float, work: Path) -> Target:
    port = free_port()
    name = f"mock-{token_delay_ms:g}ms"
    argv = [sys.executable, str(REPO / "bench" / "mock_upstream.py"), "--port", str(port),
            "--model", MODEL, "--token-delay-ms", str(token_delay_ms)]  # fmt: skip
    pid = procs.start(name, argv, dict(os.environ), work)
    if why := wait_ready(procs, name, f"http://127.0.0.1:{port}/health", 20):
        raise RuntimeError(why)
    return Target("direct", port, pid)


def write_fleet(work: Path, upstream: Target) -> Path:
    """The fleet file of a gateway in front of the mock."""
    fleet = work / "fleet.yaml"
    fleet.write_text(
        "backends:\n"
        f'  - {{name: mock, url: "http://127.0.0.1:{upstream.port}", model: {MODEL}, '
        "method: plain, gpu_type: B200}\n"
    )
    return fleet


def start_draftgate(
    procs: Processes,
    upstream: Target,
    work: Path,
    extra_env: dict[str, str],
    name: str = "draftgate",
    exe: Path = Path(sys.executable).parent / "draftgate",
) -> Target | str:
    """The gateway `exe` on a fresh SQLite database, or why it could not start."""
    port = free_port()
    fleet = write_fleet(work, upstream)
    env = dict(os.environ)
    env.update(
        DRAFTGATE_ADMIN_TOKEN="bench-admin-token-0123456789",  # noqa: S106 (throwaway, local)
        DRAFTGATE_REQUIRE_API_KEY="false",
        DRAFTGATE_DATABASE_URL=f"sqlite:///{work}/{name}-{upstream.port}.db",  # fresh each phase
        DRAFTGATE_FLEET=str(fleet),
    )
    env.update(extra_env)
    pid = procs.start(name, [str(exe), "gateway", "--port", str(port)], env, work)
    why = wait_ready(procs, name, f"http://127.0.0.1:{port}/health", 60)
    return why or Target(name, port, pid)


# `keyed`: the gateway requiring keys, one key; `teams`: 10,000 keys in 500 teams. Every
# key and team has a requests and a tokens per minute and a budget (high: none refuses).
KEYED_TARGETS = {"keyed": (1, 0), "teams": (10_000, 500)}  # (keys, teams)
BENCH_KEY = "sk-bench-overhead-0"  # the first seeded key, of a throwaway database


def seed_keys(url: str, keys: int, teams: int) -> None:
    """A fresh database at `url` with `keys` keys (BENCH_KEY the first) spread over `teams`
    teams (none at 0), each limited."""
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    from gateway.apikeys import hash_key
    from gateway.db import migrate
    from gateway.db.tables import ApiKey, Team

    engine = create_engine(url)
    migrate.upgrade(engine)
    limits = {"requests_per_minute": 10**8, "tokens_per_minute": 10**11, "budget_usd": 1e9}
    with Session(engine) as session:
        session.add_all(Team(id=t + 1, name=f"team-{t}", **limits) for t in range(teams))
        session.add_all(
            ApiKey(
                name=f"key-{i}",
                key_prefix=f"sk-bench-{i}"[:16],
                key_hash=hash_key(f"sk-bench-overhead-{i}"),
                team_id=i % teams + 1 if teams else None,
                **limits,
            )
            for i in range(keys)
        )
        session.commit()
    engine.dispose()


def start_keyed(
    procs: Processes, upstream: Target, work: Path, extra_env: dict[str, str], name: str
) -> Target | str:
    """The gateway requiring keys, on a database seeded with the target's keys and teams."""
    keys, teams = KEYED_TARGETS[name]
    url = f"sqlite:///{work}/{name}-{upstream.port}.db"
    seed_keys(url, keys, teams)
    env = {"DRAFTGATE_REQUIRE_API_KEY": "true", "DRAFTGATE_DATABASE_URL": url}
    started = start_draftgate(procs, upstream, work, extra_env | env, name)
    if isinstance(started, str):
        return started
    return Target(started.name, started.port, started.pid, key=BENCH_KEY)


def start_traced(
    procs: Processes, upstream: Target, work: Path, extra_env: dict[str, str]
) -> Target | str:
    """The gateway with tracing on, exporting to an OTLP sink of its own, or why not."""
    port = free_port()
    argv = [sys.executable, str(REPO / "bench" / "otlp_sink.py"), "--port", str(port)]
    procs.start("otlp-sink", argv, dict(os.environ), work)
    if why := wait_ready(procs, "otlp-sink", f"http://127.0.0.1:{port}/health", 20):
        return why
    env = {"DRAFTGATE_TRACING": "true",
           "DRAFTGATE_OTEL_ENDPOINT": f"http://127.0.0.1:{port}/v1/traces"}  # fmt: skip
    started = start_draftgate(procs, upstream, work, env | extra_env, "traced")
    if isinstance(started, str):
        return started
    return Target(started.name, started.port, started.pid, f"http://127.0.0.1:{port}/stats")


def spans_received(target: Target) -> int:
    """Spans the target's OTLP sink has received so far (0 for an untraced target)."""
    if target.spans_url is None:
        return 0
    counts: dict[str, int] = httpx.get(target.spans_url, timeout=5).json()
    return counts["spans"]


def ensure_tool(cache_dir: Path, name: str) -> Path | str:
    """The executable of third-party proxy `name`, from its own virtualenv (made on first
    use), or why it could not be installed."""
    requirement, executable = THIRD_PARTY[name]
    venv = cache_dir / f"{name}-venv"
    exe, marker = venv / "bin" / executable, venv / ".installed"
    if exe.exists() and marker.exists() and marker.read_text().strip() == requirement:
        return exe
    cache_dir.mkdir(parents=True, exist_ok=True)
    (cache_dir / ".gitignore").write_text("*\n")  # keep the cache out of git
    print(f"installing {requirement} into {venv} (once) ...", flush=True)
    steps = [[sys.executable, "-m", "venv", "--clear", str(venv)],
             [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check",
              requirement]]  # fmt: skip
    for argv in steps:
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=1200)  # noqa: S603
        except subprocess.TimeoutExpired:
            return f"`{shlex.join(argv)}` timed out after 20 min"
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
            return f"`{shlex.join(argv)}` failed ({done.returncode}):\n{tail}"
    marker.write_text(requirement + "\n")
    return exe


def start_granian(procs: Processes, exe: Path, upstream: Target, work: Path) -> Target | str:
    """This gateway's app served by Granian (Rust HTTP, one worker, uvloop) instead of
    uvicorn: its own virtualenv, importing this checkout and its packages by PYTHONPATH."""
    port = free_port()
    (work / "granian_app.py").write_text(
        "from gateway.app import create_app\nfrom gateway.settings import Settings\n"
        "app = create_app(Settings())\n"
    )
    fleet = write_fleet(work, upstream)
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join([str(work), str(REPO), sysconfig.get_paths()["purelib"]]),
        DRAFTGATE_ADMIN_TOKEN="bench-admin-token-0123456789",  # noqa: S106 (throwaway, local)
        DRAFTGATE_REQUIRE_API_KEY="false",
        DRAFTGATE_DATABASE_URL=f"sqlite:///{work}/granian-{upstream.port}.db",
        DRAFTGATE_FLEET=str(fleet),
    )
    argv = [str(exe), "--interface", "asgi", "--host", "127.0.0.1", "--port", str(port),
            "--workers", "1", "--loop", "uvloop", "--no-access-log", "granian_app:app"]  # fmt: skip
    pid = procs.start("granian", argv, env, work)
    why = wait_ready(procs, "granian", f"http://127.0.0.1:{port}/health", 60)
    return why or Target("granian", port, pid)


def start_floor(
    procs: Processes, upstream: Target, work: Path, name: str, workers: int
) -> Target | str:
    """bench/floor_relay.py in front of the upstream: the least a Python relay does."""
    port = free_port()
    argv = [
        sys.executable,
        str(REPO / "bench" / "floor_relay.py"),
        "--port",
        str(port),
        "--upstream",
        f"http://127.0.0.1:{upstream.port}",
        "--workers",
        str(workers),
    ]
    pid = procs.start(name, argv, dict(os.environ), work)
    return wait_ready(procs, name, f"http://127.0.0.1:{port}/health", 60) or Target(name, port, pid)


def start_vllm_router(procs: Processes, exe: Path, upstream: Target, work: Path) -> Target | str:
    """vLLM's Rust router in front of the upstream: round robin over its one worker, its
    own retries and circuit breaker at their defaults, warnings only in its log."""
    port = free_port()
    argv = [str(exe), "--worker-urls", f"http://127.0.0.1:{upstream.port}", "--host",
            "127.0.0.1", "--port", str(port), "--policy", "round_robin", "--log-level",
            "warning", "--log-dir", str(work / "vllm-router-logs")]  # fmt: skip
    pid = procs.start("vllm-router", argv, dict(os.environ), work)
    url = f"http://127.0.0.1:{port}/health"
    return wait_ready(procs, "vllm-router", url, 120) or Target("vllm-router", port, pid)


def start_litellm(procs: Processes, exe: Path, upstream: Target, work: Path) -> Target | str:
    """The LiteLLM proxy, one worker, routing MODEL to the upstream."""
    port = free_port()
    config = work / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        f"  - model_name: {MODEL}\n"
        "    litellm_params:\n"
        f"      model: openai/{MODEL}\n"
        f"      api_base: http://127.0.0.1:{upstream.port}/v1\n"
        "      api_key: sk-bench\n"
        "litellm_settings:\n"
        "  drop_params: true\n"
    )
    env = dict(os.environ)
    # No download of the price map at start, little logging, and no master key: draftgate is
    # measured with DRAFTGATE_REQUIRE_API_KEY=false, so neither proxy checks a key.
    env.update(
        LITELLM_LOCAL_MODEL_COST_MAP="True",
        LITELLM_LOG="ERROR",
        LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY="true",
    )
    argv = [str(exe), "--config", str(config), "--host", "127.0.0.1", "--port", str(port),
            "--num_workers", "1"]  # fmt: skip
    pid = procs.start("litellm", argv, env, work)
    url = f"http://127.0.0.1:{port}/health/liveliness"
    return wait_ready(procs, "litellm", url, 180) or Target("litellm", port, pid)


def request_body(stream: bool) -> bytes:
    body: dict[str, object] = {"model": MODEL, "messages": MESSAGES, "max_tokens": 32}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    return json.dumps(body).encode()


def preflight(target: Target, timeout_s: float) -> str | None:
    """None when both request kinds answer 200 with a whole response, else what went wrong.

    Retried for a while: a gateway may still be probing its backends just after start."""
    url = f"http://127.0.0.1:{target.port}/v1/chat/completions"
    deadline, why = time.monotonic() + timeout_s, ""
    while time.monotonic() < deadline:
        try:
            headers = {"content-type": "application/json"} | target.auth()  # as clients send
            plain = httpx.post(url, content=request_body(False), headers=headers, timeout=30)
            streamed = httpx.post(url, content=request_body(True), headers=headers, timeout=30)
        except httpx.HTTPError as exc:
            why = f"{type(exc).__name__}: {exc}"
        else:
            for kind, r, want in (
                ("non-streamed", plain, b'"choices"'),
                ("streamed", streamed, b"[DONE]"),
            ):
                if r.status_code != 200 or want not in r.content:
                    why = f"{kind} POST {url} -> {r.status_code}: {r.text[:300]}"
                    break
            else:
                return None
        time.sleep(1)
    return why


# --- load ----------------------------------------------------------------------------------


class ResponseError(Exception):
    """A response that was not a whole 200."""


async def read_response(reader: asyncio.StreamReader) -> tuple[bool, bytes]:
    """(keep-alive, body tail) of one HTTP/1.1 response; ResponseError unless a whole 200."""
    head = (await reader.readuntil(b"\r\n\r\n")).lower()
    status = head[9:12]
    tail = b""
    if b"transfer-encoding: chunked" in head:
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                break
            tail = (tail + await reader.readexactly(size + 2))[-256:]
    elif match := re.search(rb"content-length: *(\d+)", head):
        tail = await reader.readexactly(int(match[1]))
    else:
        tail = await reader.read()
    if status != b"200":
        raise ResponseError(f"HTTP {status.decode()}: {tail[:200]!r}")
    return b"connection: close" not in head, tail


class Client:
    """One keep-alive connection sending requests back to back."""

    def __init__(self, port: int, request: bytes, stream: bool) -> None:
        self.port, self.request = port, request
        self.expect = b"[DONE]" if stream else b'"choices"'
        self.conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def once(self) -> None:
        if self.conn is None:
            self.conn = await asyncio.open_connection("127.0.0.1", self.port)
        reader, writer = self.conn
        writer.write(self.request)
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                keep_alive, tail = await read_response(reader)
        except BaseException:
            self.close()
            raise
        if not keep_alive:
            self.close()
        if self.expect not in tail:
            raise ResponseError(f"response ended without {self.expect!r}: {tail[-120:]!r}")

    def close(self) -> None:
        if self.conn is not None:
            self.conn[1].close()
            self.conn = None


async def run_client(client: Client, stop: float, result: Result) -> None:
    """Requests until `stop`; the last one may end after it."""
    while (begun := time.perf_counter()) < stop:
        try:
            await client.once()
        except (OSError, asyncio.IncompleteReadError, TimeoutError, ResponseError, ValueError) as e:
            result.errors += 1
            result.first_error = result.first_error or f"{type(e).__name__}: {e}"
            await asyncio.sleep(0.01)
            continue
        result.latencies_s.append(time.perf_counter() - begun)
    client.close()


async def warm_up(clients: list[Client], result: Result) -> None:
    """Open every connection with one request, not counted."""
    warm = await asyncio.gather(*(c.once() for c in clients), return_exceptions=True)
    if failures := [w for w in warm if isinstance(w, BaseException)]:
        result.errors += len(failures)
        result.first_error = result.first_error or f"warm-up: {failures[0]!r}"


async def load(clients: list[Client], duration_s: float, result: Result) -> None:
    """Closed-loop load; adds the requests and the time until the last one ended."""
    before, start = len(result.latencies_s), time.perf_counter()
    await asyncio.gather(*(run_client(c, start + duration_s, result) for c in clients))
    result.elapsed_s += time.perf_counter() - start
    result.completed += len(result.latencies_s) - before


def settle(pid: int, limit_s: float = 60.0) -> float:
    """Seconds until a process is idle again (under 15% of a core over 200 ms): the work it
    queued during the load (a ledger backlog, say) is part of what the requests cost."""
    start = time.monotonic()
    while time.monotonic() - start < limit_s:
        began, cpu = time.monotonic(), tree_cpu_s(pid)
        time.sleep(0.2)
        if tree_cpu_s(pid) - cpu < 0.03:
            return began - start
    return limit_s


def measure_round(
    runner: asyncio.Runner,
    target: Target,
    upstream: Target,
    scenario: Scenario,
    duration_s: float,
    result: Result,
) -> None:
    """One round: warm the connections, load for `duration_s`, wait for the proxy to settle;
    CPU is counted from the start of the load until the proxy is idle again."""
    body = request_body(scenario.stream)
    auth = b"".join(b"%s: %s\r\n" % (k.encode(), v.encode()) for k, v in target.auth().items())
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n%s"
        b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (auth, len(body), body)
    )
    clients = [Client(target.port, request, scenario.stream) for _ in range(scenario.concurrency)]
    runner.run(warm_up(clients, result))
    proxy_cpu, upstream_cpu = tree_cpu_s(target.pid), tree_cpu_s(upstream.pid)
    spans = spans_received(target)
    runner.run(load(clients, duration_s, result))
    result.upstream_cpu_s += tree_cpu_s(upstream.pid) - upstream_cpu
    if target.pid:
        result.drain_s += settle(target.pid)
        result.proxy_cpu_s += tree_cpu_s(target.pid) - proxy_cpu
    result.spans += spans_received(target) - spans


def run_wrk(
    target: Target, concurrency: int, duration_s: float, work: Path
) -> tuple[float | None, str]:
    """wrk's req/s for non-streamed requests, and a note on anything odd."""
    script = work / "post.lua"
    auth = "".join(f'wrk.headers["{k}"] = "{v}"\n' for k, v in target.auth().items())
    script.write_text(
        'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
        f"{auth}wrk.body = [[{request_body(False).decode()}]]\n"
    )
    argv = [
        "wrk",
        "-t1",
        f"-c{concurrency}",
        f"-d{max(1, round(duration_s))}s",
        "--timeout",
        "30s",
        "-s",
        str(script),
        f"http://127.0.0.1:{target.port}/v1/chat/completions",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=duration_s + 60)  # noqa: S603
    rps = re.search(r"Requests/sec:\s+([\d.]+)", done.stdout)
    if done.returncode != 0 or rps is None:
        return None, f"wrk failed ({done.returncode}): {(done.stderr or done.stdout)[-200:]}"
    notes = re.findall(r"(Non-2xx or 3xx responses: \d+|Socket errors: [^\n]+)", done.stdout)
    return float(rps[1]), "; ".join(notes)


# --- report --------------------------------------------------------------------------------


def ratio(value: float, base: float | None) -> str:
    return f"{value / base:.3f}" if base else "-"


def print_table(
    command: str, scenario: Scenario, rounds: int, duration_s: float, results: dict[str, Result]
) -> None:
    print(f"\n$ {command}")
    print(f"{scenario.title()}: {rounds} x {duration_s:g} s per target, targets alternated")
    cols = (
        "target",
        "n",
        "req/s",
        "x direct",
        "p50 ms",
        "+p50 ms",
        "p99 ms",
        "+p99 ms",
        "proxy CPU ms/req",
        "CPU x router",
        "drain s",
        "mock CPU ms/req",
        "wrk req/s",
        "wrk x direct",
        "errors",
    )
    print("  ".join(f"{c:>{max(len(c), 9)}}" for c in cols))
    base, router = results.get("direct"), results.get("vllm-router")
    router_cpu = router.proxy_cpu_s / router.completed if router and router.completed else None
    for name, r in results.items():
        p50, p99 = r.percentile_ms(0.50), r.percentile_ms(0.99)
        per_req = 1000 / r.completed if r.completed else float("nan")
        cpu = r.proxy_cpu_s / r.completed if r.completed else float("nan")
        cells = (
            name,
            str(r.completed),
            f"{r.rps():.1f}",
            ratio(r.rps(), base.rps() if base else None),
            f"{p50:.2f}",
            f"{p50 - base.percentile_ms(0.5):+.2f}" if base else "-",
            f"{p99:.2f}",
            f"{p99 - base.percentile_ms(0.99):+.2f}" if base else "-",
            f"{r.proxy_cpu_s * per_req:.2f}" if name != "direct" else "-",
            ratio(cpu, router_cpu) if name != "direct" else "-",  # proxy CPU over the router's
            f"{r.drain_s / rounds:.1f}" if name != "direct" else "-",
            f"{r.upstream_cpu_s * per_req:.2f}",
            f"{r.wrk_rps:.1f}" if r.wrk_rps is not None else "-",
            ratio(r.wrk_rps, base.wrk_rps if base else None) if r.wrk_rps is not None else "-",
            str(r.errors),
        )
        print("  ".join(f"{c:>{max(len(h), 9)}}" for c, h in zip(cells, cols, strict=True)))
    for name, r in results.items():
        for note in (r.first_error and f"first error: {r.first_error}", r.wrk_note):
            if note:
                print(f"  {name}: {note}")
        if r.spans:  # batches leave every 5 s or at 512 spans: a round's last ones count later
            per_request = r.spans / max(r.completed, 1)
            print(
                f"  {name}: {r.spans} spans reached the OTLP sink during its rounds "
                f"({per_request:.2f}/req; the last batch of a round leaves up to 5 s later)"
            )
    sys.stdout.flush()


# --- main ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What to run, from the command line."""

    targets: list[str]
    concurrency: list[int]
    token_delays_ms: list[float]
    streams: list[bool]
    duration_s: float
    rounds: int
    wrk_s: float
    cache_dir: Path
    draftgate_env: dict[str, str]
    baseline: Path | None  # another checkout whose gateway is the target `baseline`


def start_target(
    name: str, plan: Plan, procs: Processes, upstream: Target, work: Path, tools: Tools
) -> Target | str:
    """Start one target (or say why it cannot run)."""
    if name == "direct":
        return upstream
    if name == "draftgate":
        return start_draftgate(procs, upstream, work, plan.draftgate_env)
    if workers := WORKERS_TARGET.fullmatch(name):
        env = plan.draftgate_env | {"DRAFTGATE_WORKERS": workers[1]}
        return start_draftgate(procs, upstream, work, env, name)
    if floor := FLOOR_TARGET.fullmatch(name):
        return start_floor(procs, upstream, work, name, int(floor[1] or 1))
    if name == "traced":
        return start_traced(procs, upstream, work, plan.draftgate_env)
    if name in KEYED_TARGETS:
        return start_keyed(procs, upstream, work, plan.draftgate_env, name)
    if name == "baseline" and plan.baseline is not None:
        exe = plan.baseline / ".venv" / "bin" / "draftgate"
        return start_draftgate(procs, upstream, work, plan.draftgate_env, name, exe)
    if isinstance(tool := tools.get(name), Path):
        starters = {"vllm-router": start_vllm_router, "granian": start_granian}
        return starters.get(name, start_litellm)(procs, tool, upstream, work)
    return tools.get(name) or "not installed"


def start_proxies(
    plan: Plan, procs: Processes, upstream: Target, work: Path, tools: Tools
) -> dict[str, Target]:
    """The targets of one phase that started and answered a preflight request."""
    targets: dict[str, Target] = {}
    for name in plan.targets:
        started = start_target(name, plan, procs, upstream, work, tools)
        if isinstance(started, Target):
            why = preflight(started, timeout_s=20)
            started = why if why else started
        if isinstance(started, str):
            print(f"SKIPPING {name} at this token delay: {started}", flush=True)
            for started_name in (name, "otlp-sink" if name == "traced" else ""):
                if started_name in procs.running:
                    procs.stop(started_name)
        else:
            targets[name] = started
    return targets


def drop_dead(procs: Processes, targets: dict[str, Target]) -> None:
    """Say which started processes died under load (with their logs) and stop using them."""
    for name in list(procs.running):
        if (code := procs.exited(name)) is None:
            continue
        print(f"\n{name} EXITED with {code} under load; its log ends:\n{procs.log_tail(name, 40)}")
        if name.startswith("mock-"):
            raise RuntimeError("the mock upstream died; no measurement after this is valid")
        targets.pop(name, None)
        procs.stop(name)


def run_phase(
    plan: Plan,
    procs: Processes,
    work: Path,
    delay_ms: float,
    tools: Tools,
    runner: asyncio.Runner,
    command: str,
) -> None:
    """All scenarios at one token delay: start the upstream and proxies, load, stop them."""
    upstream = start_upstream(procs, delay_ms, work)
    try:
        targets = start_proxies(plan, procs, upstream, work, tools)
        if not targets:
            print(f"no target is up at {delay_ms:g} ms/token; nothing to measure")
            return
        for stream in plan.streams:
            for c in plan.concurrency:
                scenario = Scenario(stream, delay_ms, c)
                results = {name: Result() for name in targets}
                for _ in range(plan.rounds):
                    for name, target in targets.items():
                        measure_round(
                            runner, target, upstream, scenario, plan.duration_s, results[name]
                        )
                    drop_dead(procs, targets)
                if not stream and plan.wrk_s:
                    for name, target in targets.items():
                        rps, note = run_wrk(target, c, plan.wrk_s, work)
                        results[name].wrk_rps, results[name].wrk_note = rps, note
                        if target.pid:  # its backlog must not load the next run
                            settle(target.pid)
                    drop_dead(procs, targets)
                print_table(command, scenario, plan.rounds, plan.duration_s, results)
    finally:
        procs.stop_all()


def find_wrk() -> bool:
    """Whether wrk is on PATH, installing Debian's when we can; says so when not."""
    if shutil.which("wrk"):
        return True
    if os.geteuid() == 0 and Path("/usr/bin/apt-get").exists():
        print("wrk missing: apt-get install -y wrk ...", flush=True)
        for argv in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "wrk"]):
            subprocess.run(argv, capture_output=True, timeout=600)  # noqa: S603
        if shutil.which("wrk"):
            return True
    print("wrk is not installed and could not be installed: the wrk columns are skipped")
    return False


def parse_args(argv: list[str]) -> Plan:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default=",".join(DEFAULT_TARGETS), help=f"of {ALL_TARGETS}")
    parser.add_argument("--concurrency", help="default 1,16,64,256 (--quick: 1,16)")
    parser.add_argument("--token-delays", default="0,5", help="ms per token, comma-separated")
    parser.add_argument("--modes", default="plain,stream", help="plain and/or stream")
    parser.add_argument("--duration", type=float, help="s per round; default 5 (--quick: 1)")
    parser.add_argument("--rounds", type=int, help="per target and scenario; default 2 (quick: 1)")
    parser.add_argument("--wrk-duration", type=float, default=None, help="0 skips wrk")
    parser.add_argument("--cache-dir", type=Path, default=REPO / ".bench-cache")
    parser.add_argument(
        "--draftgate-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra environment for the gateway, e.g. DRAFTGATE_LOG_LEVEL=warning",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        metavar="DIR",
        help="another checkout with its own .venv (made by its `make`), measured as `baseline`",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke test: c=1,16, 1 s, one round")
    args = parser.parse_args(argv)
    quick = {"concurrency": "1,16", "duration": 1.0, "rounds": 1}
    full = {"concurrency": "1,16,64,256", "duration": 5.0, "rounds": 2}
    for name, value in (quick if args.quick else full).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    if args.baseline is not None:
        if not (args.baseline / ".venv" / "bin" / "draftgate").exists():
            parser.error(f"--baseline {args.baseline}: no .venv/bin/draftgate there (run make)")
        targets = [*targets, "baseline"] if "baseline" not in targets else targets
    known = {*ALL_TARGETS, "baseline"}
    if unknown := {
        t
        for t in targets
        if t not in known and not WORKERS_TARGET.fullmatch(t) and not FLOOR_TARGET.fullmatch(t)
    }:
        parser.error(f"unknown targets {sorted(unknown)}; choose from {ALL_TARGETS}")
    if "baseline" in targets and args.baseline is None:
        parser.error("the target `baseline` needs --baseline DIR")
    modes = args.modes.split(",")
    return Plan(
        targets=targets,
        concurrency=[int(c) for c in args.concurrency.split(",")],
        token_delays_ms=[float(d) for d in args.token_delays.split(",")],
        streams=[m == "stream" for m in ("plain", "stream") if m in modes],
        duration_s=args.duration,
        rounds=args.rounds,
        wrk_s=args.duration if args.wrk_duration is None else args.wrk_duration,
        cache_dir=args.cache_dir,
        draftgate_env=dict(kv.split("=", 1) for kv in args.draftgate_env),
        baseline=args.baseline,
    )


def on_sigterm(signum: int, frame: FrameType | None) -> NoReturn:
    raise KeyboardInterrupt  # unwinds through the cleanup below, as Ctrl-C does


@contextmanager
def event_loop() -> Iterator[asyncio.Runner]:
    """uvloop when installed, so the load generator is cheap."""
    try:
        import uvloop
    except ImportError:
        with asyncio.Runner() as runner:
            yield runner
    else:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            yield runner


def commit_of(checkout: Path) -> str:
    git = ["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"]
    return subprocess.run(git, capture_output=True, text=True).stdout.strip()  # noqa: S603


def describe_machine(plan: Plan, tools: Tools) -> None:
    python = sys.version.split()[0]
    print(f"machine: {os.cpu_count()} CPUs, Python {python}, draftgate {commit_of(REPO)}")
    if plan.baseline is not None:
        print(f"baseline: the gateway of {commit_of(plan.baseline)}")
    for name, tool in tools.items():
        if isinstance(tool, Path):
            package = THIRD_PARTY[name][0].split("[")[0].split("=")[0]
            pip = [str(tool.parent / "pip"), "show", package]
            shown = subprocess.run(pip, capture_output=True, text=True)  # noqa: S603
            version = re.search(r"Version: (\S+)", shown.stdout)
            print(f"{name} {version[1] if version else '?'} from {tool}")
    print("load generator: closed-loop keep-alive clients over raw asyncio sockets, this process")
    print("latency: whole response (last byte); req/s: responses / (load start to last one)")
    print("proxy CPU: /proc/<pid>/stat utime+stime (10 ms ticks) of its process tree, from the")
    print("  start of the load until it is idle again; drain s: how long that took per round")


def main(argv: list[str]) -> int:
    plan = parse_args(argv)
    command = shlex.join([".venv/bin/python", "bench/overhead.py", *argv])
    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started in background
    tools: Tools = {
        name: ensure_tool(plan.cache_dir, name) for name in THIRD_PARTY if name in plan.targets
    }
    for name, tool in tools.items():
        if isinstance(tool, str):
            print(f"SKIPPING {name}: {tool}", flush=True)
    if plan.wrk_s and not find_wrk():
        plan = Plan(**{**plan.__dict__, "wrk_s": 0.0})
    describe_machine(plan, tools)
    with tempfile.TemporaryDirectory(prefix="dg-overhead-") as tmp:
        procs = Processes(Path(tmp))
        try:
            with event_loop() as runner:
                for delay_ms in plan.token_delays_ms:
                    run_phase(plan, procs, Path(tmp), delay_ms, tools, runner, command)
        except KeyboardInterrupt:
            print("\ninterrupted; stopping what this benchmark started", file=sys.stderr)
            return 130
        finally:
            procs.stop_all()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
