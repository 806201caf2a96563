"""Soak: N closed-loop streaming clients through `draftgate gateway` to simulators for a while.

Starts `--sims` simulators (`draftgate sim`, plain, `--time-scale`) and one gateway in front
of them on a fresh SQLite database (or `--database-url`), then runs `--concurrency` clients,
each sending streamed chat completions one after another for `--duration` seconds. Prints
requests, errors (non-200, an SSE error event, a stream without [DONE], a connection
failure), completed requests and output tokens per `--report-interval`, the gateway's RSS
(VmRSS of its pid from /proc) at start, after warm-up and at the end, the usage records the
ledger wrote against the requests sent, and the command line. `--json` adds one JSON line
with the same figures (what tests/reliability/test_soak.py reads).

Run: .venv/bin/python bench/soak.py [--concurrency 256] [--duration 600] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shlex
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp
import httpx
import yaml
from sqlalchemy import create_engine, text

DRAFTGATE = Path(sys.executable).parent / "draftgate"
MODEL = "openai/gpt-oss-20b"
MESSAGES = [{"role": "user", "content": "Write a short note about soak tests."}]
START_TIMEOUT_S = 60.0
LEDGER_TIMEOUT_S = 120.0
REQUEST_TIMEOUT_S = 120.0
WARMUP_S = 30.0  # RSS after this much load (or a third of a shorter run) is the baseline


@dataclass
class Figures:
    """What a soak run measured."""

    command: str
    concurrency: int
    duration_s: float
    requests: int = 0
    errors: int = 0
    first_errors: list[str] = field(default_factory=list)
    errors_by_kind: dict[str, int] = field(default_factory=dict)
    errors_per_interval: list[int] = field(default_factory=list)
    retried: float = 0.0  # the gateway's draftgate_upstream_retries_total at the end
    completion_tokens: int = 0
    per_interval: list[int] = field(default_factory=list)  # completed requests
    tokens_per_interval: list[int] = field(default_factory=list)
    interval_s: float = 60.0
    rss_start_mb: float = 0.0
    rss_warm_mb: float = 0.0
    rss_end_mb: float = 0.0
    rss_max_mb: float = 0.0
    rss_per_interval_mb: list[float] = field(default_factory=list)  # at each interval's end
    records: int = 0  # usage records the ledger wrote for this run's requests


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def rss_mb(pid: int) -> float:
    """Resident memory of a process (VmRSS from /proc), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def start(args: list[str], env: dict[str, str], log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """Start `draftgate ARGS --port P`, wait for /health; (process, base URL)."""
    port = free_port()
    with log.open("wb") as out:
        process = subprocess.Popen(  # noqa: S603  (our own console script)
            [str(DRAFTGATE), *args, "--port", str(port)],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=log.parent,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{args[0]} exited early:\n{log.read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                return process, url
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{args[0]} did not answer /health within {START_TIMEOUT_S} s")


def clean_env(**variables: str) -> dict[str, str]:
    """This environment without DRAFTGATE_* variables, plus `variables`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRAFTGATE_")}
    return env | variables


class Load:
    """Closed-loop streaming clients; counts per reporting interval."""

    def __init__(self, url: str, figures: Figures, max_tokens: int) -> None:
        self.url, self.figures, self.max_tokens = url, figures, max_tokens
        self.completed: Counter[int] = Counter()
        self.failed: Counter[int] = Counter()
        self.kinds: Counter[str] = Counter()
        self.tokens: Counter[int] = Counter()
        self.request_ids: list[str] = []
        self.started = 0.0

    async def run(self, deadline: float) -> None:
        """Run every client until `deadline` (monotonic); requests in flight finish."""
        self.started = time.monotonic()
        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            clients = [self._client(session, deadline) for _ in range(self.figures.concurrency)]
            await asyncio.gather(*clients)

    async def _client(self, session: aiohttp.ClientSession, deadline: float) -> None:
        while time.monotonic() < deadline:
            request_id = uuid.uuid4().hex
            self.request_ids.append(request_id)
            self.figures.requests += 1
            try:
                error, tokens = await self._one(session, request_id)
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                error, tokens = f"{type(exc).__name__}: {exc}", 0
            elapsed_s = min(time.monotonic() - self.started, self.figures.duration_s - 1e-6)
            bucket = int(elapsed_s // self.figures.interval_s)  # late finishers: last bucket
            if error:
                self.figures.errors += 1
                self.failed[bucket] += 1
                self.kinds[error_kind(error)] += 1
                if len(self.figures.first_errors) < 5:
                    self.figures.first_errors.append(error[:300])
                continue
            self.completed[bucket] += 1
            self.tokens[bucket] += tokens
            self.figures.completion_tokens += tokens

    async def _one(self, session: aiohttp.ClientSession, request_id: str) -> tuple[str, int]:
        body = {
            "model": MODEL,
            "messages": MESSAGES,
            "max_tokens": self.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        async with session.post(
            f"{self.url}/v1/chat/completions", json=body, headers={"x-request-id": request_id}
        ) as response:
            if response.status != 200:
                return f"HTTP {response.status}: {(await response.text())[:200]}", 0
            done, tokens = False, 0
            async for raw in response.content:
                line = raw.decode().strip()
                if not line.startswith("data: "):
                    continue
                data = line.removeprefix("data: ")
                if data == "[DONE]":
                    done = True
                    continue
                chunk = json.loads(data)
                if "error" in chunk:
                    return f"SSE error: {json.dumps(chunk['error'])[:200]}", 0
                if chunk.get("usage"):
                    tokens = int(chunk["usage"].get("completion_tokens", 0))
            return ("" if done else "stream ended without [DONE]"), tokens


async def watch_rss(pid: int, figures: Figures, deadline: float) -> None:
    """Sample the gateway's RSS every second: its maximum, and its value after warm-up."""
    started = time.monotonic()
    warm_at = started + min(WARMUP_S, figures.duration_s / 3)
    while time.monotonic() < deadline:
        rss = rss_mb(pid)
        figures.rss_max_mb = max(figures.rss_max_mb, rss)
        intervals = len(figures.rss_per_interval_mb)
        if time.monotonic() - started >= figures.interval_s * (intervals + 1):
            figures.rss_per_interval_mb.append(round(rss, 1))
        if not figures.rss_warm_mb and time.monotonic() >= warm_at:
            figures.rss_warm_mb = rss
        await asyncio.sleep(1.0)


def error_kind(error: str) -> str:
    """An error's class for counting: its status or exception and the envelope's message."""
    head, _, rest = error.partition(":")
    message = rest.split('"message":"')[-1][:60].strip()
    return f"{head}: {message}"


def gateway_counter(url: str, name: str) -> float:
    """The sum of a counter's samples in the gateway's GET /metrics."""
    text = httpx.get(f"{url}/metrics", timeout=30.0).text
    return sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith(name + "{") or line.startswith(name + " ")
    )


def count_records(database_url: str, request_ids: list[str]) -> int:
    """Poll the ledger until it holds a record per request (or time out); how many it has."""
    url = database_url.replace("postgresql://", "postgresql+psycopg://", 1)
    engine, wanted = create_engine(url), set(request_ids)
    deadline = time.monotonic() + LEDGER_TIMEOUT_S
    try:
        while True:
            with engine.connect() as conn:
                ids = conn.execute(text("SELECT client_request_id FROM usage_records"))
                found = len(wanted.intersection(row[0] for row in ids))
            if found >= len(wanted) or time.monotonic() > deadline:
                return found
            time.sleep(1.0)
    finally:
        engine.dispose()


def soak(args: argparse.Namespace, workdir: Path, figures: Figures) -> None:
    """Start the sims and the gateway, run the load, fill in `figures`."""
    processes: list[subprocess.Popen[bytes]] = []
    try:
        sims = []
        for i in range(args.sims):
            sim_args = ["sim", "--model", MODEL, "--time-scale", str(args.time_scale),
                        "--seed", str(i)]  # fmt: skip
            process, url = start(sim_args, clean_env(), workdir / f"sim-{i}.log")
            processes.append(process)
            sims.append(url)
        fleet = workdir / "fleet.yaml"
        backends = [
            {"name": f"sim-{i}", "url": u, "model": MODEL, "method": "plain"}
            for i, u in enumerate(sims)
        ]
        fleet.write_text(yaml.safe_dump({"backends": backends}), encoding="utf-8")
        database_url = args.database_url or f"sqlite:///{workdir}/draftgate.db"
        env = clean_env(
            DRAFTGATE_ADMIN_TOKEN=secrets.token_urlsafe(24),
            DRAFTGATE_DATABASE_URL=database_url,
            DRAFTGATE_FLEET=str(fleet),
            DRAFTGATE_REQUIRE_API_KEY="false",
            DRAFTGATE_LOG_LEVEL="warning",
        )
        gateway, url = start(["gateway"], env, workdir / "gateway.log")
        processes.append(gateway)
        figures.rss_start_mb = rss_mb(gateway.pid)
        load = Load(url, figures, args.max_tokens)
        deadline = time.monotonic() + args.duration

        async def both() -> None:
            await asyncio.gather(load.run(deadline), watch_rss(gateway.pid, figures, deadline))

        asyncio.run(both())
        figures.rss_end_mb = rss_mb(gateway.pid)
        figures.rss_warm_mb = figures.rss_warm_mb or figures.rss_start_mb
        buckets = range(max([*load.completed, *load.failed], default=-1) + 1)
        figures.per_interval = [load.completed[b] for b in buckets]
        figures.tokens_per_interval = [load.tokens[b] for b in buckets]
        figures.errors_per_interval = [load.failed[b] for b in buckets]
        figures.errors_by_kind = dict(load.kinds.most_common())
        figures.retried = gateway_counter(url, "draftgate_upstream_retries_total")
        figures.records = count_records(database_url, load.request_ids)
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()


def report(figures: Figures) -> None:
    """Print the figures for people."""
    minutes = figures.duration_s / 60
    print(f"command: {figures.command}")
    print(
        f"c={figures.concurrency}, {figures.duration_s:.0f} s: requests {figures.requests}, "
        f"errors {figures.errors}, ledger records {figures.records} "
        f"(lost {figures.requests - figures.records})"
    )
    print(f"completed per {figures.interval_s:.0f} s: {figures.per_interval}")
    print(f"output tokens per {figures.interval_s:.0f} s: {figures.tokens_per_interval}")
    print(f"errors per {figures.interval_s:.0f} s: {figures.errors_per_interval}")
    print(f"errors by kind: {figures.errors_by_kind}; gateway retries: {figures.retried:.0f}")
    print(f"mean completed requests per minute: {sum(figures.per_interval) / minutes:.0f}")
    print(
        f"gateway RSS: start {figures.rss_start_mb:.1f} MB, after warm-up "
        f"{figures.rss_warm_mb:.1f} MB, end {figures.rss_end_mb:.1f} MB, "
        f"max {figures.rss_max_mb:.1f} MB"
    )
    print(f"gateway RSS per {figures.interval_s:.0f} s (MB): {figures.rss_per_interval_mb}")
    for error in figures.first_errors:
        print(f"error: {error}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of load")
    parser.add_argument("--report-interval", type=float, default=60.0, help="seconds")
    parser.add_argument("--sims", type=int, default=2)
    parser.add_argument("--time-scale", type=float, default=10.0, help="simulator speed-up")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--database-url", default=None, help="default: a fresh SQLite file")
    parser.add_argument("--json", action="store_true", help="also print the figures as JSON")
    parser.add_argument("--workdir", type=Path, default=None, help="keep logs and database here")
    args = parser.parse_args()
    command = shlex.join([".venv/bin/python", "bench/soak.py", *sys.argv[1:]])
    figures = Figures(command, args.concurrency, args.duration, interval_s=args.report_interval)
    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
        soak(args, args.workdir, figures)
    else:
        with tempfile.TemporaryDirectory(prefix="draftgate-soak-") as tmp:
            soak(args, Path(tmp), figures)
    report(figures)
    if args.json:
        print(json.dumps(asdict(figures)))
    return 0 if figures.errors == 0 and figures.records == figures.requests else 1


if __name__ == "__main__":
    raise SystemExit(main())
