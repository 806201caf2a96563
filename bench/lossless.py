"""The lossless watchdog's cost to the client: the same greedy load with the watchdog off and on.

Starts two simulators of one model at real speed (`--time-scale 1`): plain, and DSpark with
K=5. Every gateway declares both and pins the model to DSpark, so clients are served by DSpark
and the watchdog's replays (docs/lossless.md) go to plain. Configurations (`--configs`):
- `off`: DRAFTGATE_LOSSLESS_SAMPLE_SHARE=0, the base of every ratio;
- `share-1`: every greedy request sampled, with a cap and a queue no load here reaches
  (DRAFTGATE_LOSSLESS_MAX_PER_MINUTE=1000000, DRAFTGATE_LOSSLESS_QUEUE=100000): the most
  replay work a gateway can be given; replays still run one at a time per process;
- `share-1-cap-1`: every request sampled (its answer transcribed as it passes) but one
  replay a minute: what sampling costs the hot path, apart from the replays;
- `share-0.1`: a tenth sampled, cap (30 a minute) and queue (64) at their defaults;
- `off-again`: `off` once more, a control: how far two identical configurations differ
  here by chance.

Each scenario (streamed or whole chat completions, at each concurrency) runs closed-loop
keep-alive clients over raw sockets, every request greedy (temperature 0) with its own prompt
and a fixed number of output tokens (`ignore_eos`). Each configuration runs on a fresh
gateway (fresh SQLite database), started for that one scenario and stopped after it; the
configurations alternate within a round, their order rotated round by round, so drift on
this shared machine falls on all alike. After each gateway stops, the plain simulator is let
go idle (an abandoned replay is aborted), so no replay load carries into the next run.

Per configuration and scenario: client TTFT (first non-empty content; streamed only) and
end-to-end latency p50/p90/p99, req/s, the gateway's CPU ms per served request (utime+stime
of its process from /proc over the load window, replays included), the replays compared
meanwhile (`draftgate_lossless_checks_total`) and samples dropped
(`draftgate_lossless_dropped_total` by reason), requests the plain simulator finished, and
each simulator's CPU; every figure also as a ratio to `off`.

Run: .venv/bin/python bench/lossless.py [--configs off,share-1,share-1-cap-1,share-0.1,off-again]
     [--concurrency 8,32] [--modes stream,whole] [--tokens 128] [--duration 8] [--rounds 2]
     [--warm 1] [--time-scale 1]
"""

# Over 400 lines: one benchmark read top to bottom (load generator, servers, report), as the
# other scripts here; its pieces serve nothing else.

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tests' real servers
sys.path.insert(0, str(Path(__file__).resolve().parent))  # overhead.py's helpers

from overhead import REPO, ResponseError, event_loop, on_sigterm, tree_cpu_s

from tests.e2e.conftest import (
    SIM_MODEL,
    Server,
    draftgate_env,
    fleet_backend,
    gateway_env,
    metric_value,
    sim_args,
    spawn_server,
    write_fleet,
)

SPEC_METHOD, SPEC_K = "dspark", 5
CONFIGS: dict[str, dict[str, str]] = {
    "off": {},
    "share-1": {
        "LOSSLESS_SAMPLE_SHARE": "1",
        "LOSSLESS_MAX_PER_MINUTE": "1000000",
        "LOSSLESS_QUEUE": "100000",
    },
    "share-1-cap-1": {"LOSSLESS_SAMPLE_SHARE": "1", "LOSSLESS_MAX_PER_MINUTE": "1"},
    "share-0.1": {"LOSSLESS_SAMPLE_SHARE": "0.1"},
    "off-again": {},
}
# The e2e helpers flush the ledger every 0.2 s for quick tests; the default is 0.5 s. Their
# 0.5 s probes stay: a fresh gateway routes within a second (the default, 5 s, is the same
# small cost in every configuration).
GATEWAY_SETTINGS = {"LEDGER_FLUSH_INTERVAL_S": "0.5"}
DROP_REASONS = ("cap", "queue", "no_reference", "replay_failed")
FIRST_TOKEN = re.compile(rb'"(?:reasoning_)?content":"[^"]')  # the role chunk's content is ""
REQUEST_TIMEOUT_S = 120.0
READY_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Scenario:
    """One load shape."""

    stream: bool
    concurrency: int

    def title(self) -> str:
        return f"{'streamed' if self.stream else 'whole'} chat, c={self.concurrency}"


@dataclass
class Cell:
    """One configuration in one scenario, pooled over its rounds."""

    ttft_s: list[float] = field(default_factory=list)
    e2e_s: list[float] = field(default_factory=list)
    elapsed_s: float = 0.0
    gateway_cpu_s: float = 0.0
    plain_cpu_s: float = 0.0
    spec_cpu_s: float = 0.0
    checks: float = 0.0
    dropped: dict[str, float] = field(default_factory=dict)
    plain_finished: float = 0.0  # requests the plain simulator finished: the replays
    errors: int = 0
    first_error: str = ""
    load_1min: list[float] = field(default_factory=list)  # the machine's, after each run

    def rps(self) -> float:
        return len(self.e2e_s) / self.elapsed_s if self.elapsed_s else 0.0

    def cpu_ms_per_request(self) -> float:
        return 1000 * self.gateway_cpu_s / len(self.e2e_s) if self.e2e_s else float("nan")


def percentile_ms(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


# --- load --------------------------------------------------------------------------------


class Client:
    """One keep-alive connection sending greedy requests back to back, each its own prompt."""

    def __init__(self, port: int, stream: bool, tokens: int) -> None:
        self.port, self.stream, self.tokens = port, stream, tokens
        self.conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    def request(self) -> bytes:
        prompt = f"Explain request {uuid.uuid4().hex} of the lossless benchmark."
        body = orjson.dumps({
            "model": SIM_MODEL, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": self.tokens, "ignore_eos": True, "temperature": 0,
            "stream": self.stream,
        })  # fmt: skip
        head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
        return head + b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
            len(body), body,
        )  # fmt: skip

    async def once(self) -> tuple[float | None, float]:
        """(TTFT or None, end to end) in seconds, of one request."""
        if self.conn is None:
            self.conn = await asyncio.open_connection("127.0.0.1", self.port)
        reader, writer = self.conn
        started = time.perf_counter()
        writer.write(self.request())
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                ttft = await self.read(reader, started)
        except BaseException:
            self.close()
            raise
        return ttft, time.perf_counter() - started

    async def read(self, reader: asyncio.StreamReader, started: float) -> float | None:
        """Read one response; its TTFT when streamed. ResponseError unless a whole 200."""
        head = (await reader.readuntil(b"\r\n\r\n")).lower()
        ttft, seen = None, b""
        if b"transfer-encoding: chunked" in head:
            while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
                seen = seen[-64:] + await reader.readexactly(size + 2)
                if ttft is None and FIRST_TOKEN.search(seen):
                    ttft = time.perf_counter() - started
            await reader.readuntil(b"\r\n")
        elif match := re.search(rb"content-length: *(\d+)", head):
            seen = await reader.readexactly(int(match[1]))
        if head[9:12] != b"200" or (b"[DONE]" if self.stream else b'"choices"') not in seen:
            raise ResponseError(f"{head[:12]!r} ... {seen[-160:]!r}")
        if b"connection: close" in head:
            self.close()
        return ttft

    def close(self) -> None:
        if self.conn is not None:
            self.conn[1].close()
            self.conn = None


async def run_client(client: Client, stop: float, cell: Cell) -> None:
    """Requests until `stop` (the last one may end after it), then the connection closes."""
    while time.perf_counter() < stop:
        try:
            ttft, e2e = await client.once()
        except (OSError, asyncio.IncompleteReadError, TimeoutError, ResponseError, ValueError) as e:
            cell.errors += 1
            cell.first_error = cell.first_error or f"{type(e).__name__}: {e}"
            await asyncio.sleep(0.05)
            continue
        cell.e2e_s.append(e2e)
        if ttft is not None:
            cell.ttft_s.append(ttft)
    client.close()


async def load(clients: list[Client], duration_s: float, cell: Cell | None) -> None:
    """Closed-loop load for `duration_s` (None: a warm-up, not counted)."""
    into = cell or Cell()
    start = time.perf_counter()
    await asyncio.gather(*(run_client(c, start + duration_s, into) for c in clients))
    if cell is not None:
        cell.elapsed_s += time.perf_counter() - start


# --- servers -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fleet:
    plain: Server
    spec: Server
    file: Path


def start_simulators(work: Path, time_scale: float) -> Fleet:
    """The plain and the speculative simulator, healthy, and the fleet file naming both."""
    scale = ("--time-scale", f"{time_scale:g}")
    plain = spawn_server(sim_args(*scale), draftgate_env(), work)
    spec = spawn_server(
        sim_args("--method", SPEC_METHOD, "--k", str(SPEC_K), *scale), draftgate_env(), work
    )
    for server in (plain, spec):
        server.wait_healthy()
    backends = [
        fleet_backend("b-plain", plain.base_url),
        fleet_backend(f"b-{SPEC_METHOD}", spec.base_url, SPEC_METHOD, k=SPEC_K),
    ]
    policy = {"mode": "pinned", "method": SPEC_METHOD}
    fleet = write_fleet(work / "fleet.yaml", backends, [{"name": SIM_MODEL, "policy": policy}])
    return Fleet(plain, spec, fleet)


def start_gateway(config: str, fleet: Fleet, work: Path) -> Server:
    """A fresh gateway (its own SQLite file) in `config`, once it serves by DSpark and counts
    both backends healthy (replays need plain)."""
    database = f"sqlite:///{work}/gateway-{uuid.uuid4().hex[:8]}.db"
    settings = GATEWAY_SETTINGS | CONFIGS[config]
    gateway = spawn_server(("gateway",), gateway_env(database, fleet.file, **settings), work)
    gateway.wait_healthy()
    body = {"model": SIM_MODEL, "messages": [{"role": "user", "content": "ready?"}],
            "max_tokens": 1}  # not greedy: never sampled  # fmt: skip
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        healthy = metric_value(gateway.base_url, "draftgate_backend_healthy")
        served = httpx.post(f"{gateway.base_url}/v1/chat/completions", json=body, timeout=30)
        if healthy == 2 and served.headers.get("x-draftgate-method") == SPEC_METHOD:
            return gateway
        time.sleep(0.2)
    gateway.close()
    raise RuntimeError(f"the gateway did not route to {SPEC_METHOD}:\n{gateway.output()[-2000:]}")


def wait_idle(sim: Server, timeout_s: float = 30.0) -> None:
    """Until the simulator runs and queues no request (an abandoned replay is aborted)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        busy = sum(
            metric_value(sim.base_url, f"vllm:num_requests_{state}")
            for state in ("running", "waiting")
        )
        if busy == 0:
            return
        time.sleep(0.1)
    print(f"  the simulator at {sim.base_url} is still busy after {timeout_s:g} s", flush=True)


def watchdog_counters(gateway: Server, plain: Server) -> dict[str, float]:
    counters = {"checks": metric_value(gateway.base_url, "draftgate_lossless_checks_total")}
    for reason in DROP_REASONS:
        dropped = metric_value(gateway.base_url, "draftgate_lossless_dropped_total", reason=reason)
        counters[reason] = dropped
    counters["plain"] = metric_value(plain.base_url, "vllm:request_success_total")
    return counters


def measure(
    runner: asyncio.Runner, config: str, scenario: Scenario, plan: Plan, fleet: Fleet, cell: Cell
) -> None:
    """One configuration in one scenario on a fresh gateway: warm it up (uncounted), load it
    for the duration, stop it and let the plain simulator go idle."""
    gateway = start_gateway(config, fleet, plan.work)
    try:
        clients = [
            Client(gateway.port, scenario.stream, plan.tokens) for _ in range(scenario.concurrency)
        ]
        runner.run(load(clients, plan.warm_s, None))
        before = watchdog_counters(gateway, fleet.plain)
        pids = (gateway.process.pid, fleet.plain.process.pid, fleet.spec.process.pid)
        cpu = [tree_cpu_s(pid) for pid in pids]
        runner.run(load(clients, plan.duration_s, cell))
        cpu = [tree_cpu_s(pid) - was for pid, was in zip(pids, cpu, strict=True)]
        after = watchdog_counters(gateway, fleet.plain)
        cell.load_1min.append(os.getloadavg()[0])
    finally:
        gateway.close()
    wait_idle(fleet.plain)
    cell.gateway_cpu_s += cpu[0]
    cell.plain_cpu_s += cpu[1]
    cell.spec_cpu_s += cpu[2]
    cell.checks += after["checks"] - before["checks"]
    cell.plain_finished += after["plain"] - before["plain"]
    for reason in DROP_REASONS:
        cell.dropped[reason] = cell.dropped.get(reason, 0.0) + after[reason] - before[reason]


# --- report --------------------------------------------------------------------------------


def with_ratio(value: float, base: float, digits: int = 1) -> str:
    if value != value:  # NaN: not measured
        return "-"
    ratio = f" ({value / base:.2f}x)" if base and base == base else ""
    return f"{value:.{digits}f}{ratio}"


def row(name: str, cell: Cell, off: Cell, rounds: int, duration_s: float) -> list[str]:
    def latency(values: list[float], base: list[float], q: float) -> str:
        return with_ratio(percentile_ms(values, q), percentile_ms(base, q))

    seconds = rounds * duration_s
    drops = "/".join(f"{cell.dropped.get(r, 0):.0f}" for r in DROP_REASONS)
    return [
        name,
        str(len(cell.e2e_s)),
        with_ratio(cell.rps(), off.rps()),
        *(latency(cell.ttft_s, off.ttft_s, q) for q in (0.5, 0.9, 0.99)),
        *(latency(cell.e2e_s, off.e2e_s, q) for q in (0.5, 0.9, 0.99)),
        with_ratio(cell.cpu_ms_per_request(), off.cpu_ms_per_request(), 2),
        f"{cell.checks:.0f} ({cell.checks / max(len(cell.e2e_s), 1):.1%})",
        drops,
        f"{cell.plain_finished / seconds:.2f}",
        f"{100 * cell.plain_cpu_s / seconds:.1f}",  # near 0 when off: no ratio
        with_ratio(100 * cell.spec_cpu_s / seconds, 100 * off.spec_cpu_s / seconds),
        "/".join(f"{load:.1f}" for load in cell.load_1min),
        str(cell.errors),
    ]


COLUMNS = (
    "config", "served", "req/s", "TTFT p50 ms", "TTFT p90 ms", "TTFT p99 ms", "e2e p50 ms",
    "e2e p90 ms", "e2e p99 ms", "gw CPU ms/req", "replays (of served)",
    "dropped cap/queue/noref/fail", "plain req/s", "plain sim %CPU", "dspark sim %CPU",
    "load 1 min", "errors",
)  # fmt: skip


def print_table(scenario: Scenario, cells: dict[str, Cell], plan: Plan) -> None:
    print(f"\n{scenario.title()}: {plan.rounds} x {plan.duration_s:g} s per configuration")
    rows = [list(COLUMNS)]
    rows += [
        row(name, cell, cells["off"], plan.rounds, plan.duration_s) for name, cell in cells.items()
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    for cells_of_row in rows:
        print("  ".join(c.rjust(w) for c, w in zip(cells_of_row, widths, strict=True)))
    for name, cell in cells.items():
        if cell.first_error:
            print(f"  {name}: {cell.errors} errors, the first: {cell.first_error}")
    sys.stdout.flush()


# --- main --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What to run, from the command line."""

    scenarios: list[Scenario]
    configs: list[str]
    tokens: int
    duration_s: float
    warm_s: float
    rounds: int
    time_scale: float
    work: Path = Path()


def parse_args(argv: list[str]) -> Plan:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default=",".join(CONFIGS), help="of those above; off first")
    parser.add_argument("--concurrency", default="8,32", help="clients, comma-separated")
    parser.add_argument("--modes", default="stream,whole", help="stream and/or whole")
    parser.add_argument("--tokens", type=int, default=128, help="output tokens per request")
    parser.add_argument("--duration", type=float, default=8.0, help="s of load per run")
    parser.add_argument("--warm", type=float, default=1.0, help="s of uncounted load first")
    parser.add_argument("--rounds", type=int, default=2, help="runs per configuration")
    parser.add_argument("--time-scale", type=float, default=1.0, help="the simulators' speed")
    args = parser.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",")]
    if unknown := set(modes) - {"stream", "whole"}:
        parser.error(f"unknown modes {sorted(unknown)}: choose stream and/or whole")
    configs = [c.strip() for c in args.configs.split(",")]
    if unknown := set(configs) - set(CONFIGS):
        parser.error(f"unknown configs {sorted(unknown)}: choose from {list(CONFIGS)}")
    if configs[0] != "off":
        parser.error("--configs must begin with off: the base of every ratio")
    scenarios = [
        Scenario(mode == "stream", int(c)) for mode in modes for c in args.concurrency.split(",")
    ]
    return Plan(
        scenarios, configs, args.tokens, args.duration, args.warm, args.rounds, args.time_scale
    )


def loadavg() -> str:
    return ", ".join(f"{v:.2f}" for v in os.getloadavg())


def describe(plan: Plan, command: str) -> None:
    commit = subprocess.run(  # noqa: S603
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],  # noqa: S607
        capture_output=True, text=True, check=False,
    ).stdout.strip()  # fmt: skip
    print(f"$ {command}")
    print(f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, draftgate {commit}")
    print(f"load average (1, 5, 15 min) at start: {loadavg()}")
    print(f"simulators of {SIM_MODEL} on B200 at time scale {plan.time_scale:g}: plain, and "
          f"{SPEC_METHOD} K={SPEC_K}; the model pinned to {SPEC_METHOD}; replays go to "
          "plain")  # fmt: skip
    for name in plan.configs:
        settings = CONFIGS[name]
        shown = " ".join(f"DRAFTGATE_{k}={v}" for k, v in settings.items()) or "(watchdog off)"
        print(f"  {name}: {shown}")
    print(f"requests: greedy chat, {plan.tokens} output tokens (ignore_eos), a prompt of "
          f"their own; closed loop, raw keep-alive sockets, {plan.warm_s:g} s warm-up per "
          "run")  # fmt: skip
    print("each run on a fresh gateway; configurations alternated, their order rotated by round")
    sys.stdout.flush()


FOOTNOTES = (
    "x: ratio to `off` in the same scenario; `off-again` against `off` is the noise of this "
    "machine.",
    "TTFT: to the first non-empty content chunk (streamed only). gw CPU: the gateway's "
    "utime+stime over the load window, per served request, replays included.",
    "replays: checks completed in the window (and as a share of served requests); they run one "
    "at a time per process, so share-1 replays what one plain stream can, and the rest wait "
    "in its queue until the gateway stops.",
    "dropped: samples dropped unreplayed, by reason. The cap counts per clock minute: a "
    "fresh gateway's first 30 samples go at once, so a window of seconds holds that burst.",
    "plain req/s: requests the plain simulator finished: the replays. They load the plain "
    "backend, not the DSpark one serving the clients: that is the point. Here the plain "
    "simulator shares the CPUs with the gateway, the DSpark simulator and the clients, which a "
    "real plain backend (a server of its own) would not.",
    "load 1 min: the machine's 1-minute load average after each run (2 CPUs).",
)


def footnotes(took_s: float) -> None:
    print()
    for note in FOOTNOTES:
        print(textwrap.fill(note, 100, subsequent_indent="  "))
    print(f"load average (1, 5, 15 min) at the end: {loadavg()}; the run took {took_s:.0f} s")


def run(plan: Plan, runner: asyncio.Runner) -> None:
    fleet = start_simulators(plan.work, plan.time_scale)
    try:
        results = {s: {name: Cell() for name in plan.configs} for s in plan.scenarios}
        names = plan.configs
        for r in range(plan.rounds):
            for i, scenario in enumerate(plan.scenarios):
                shift = (r + i) % len(names)
                for config in names[shift:] + names[:shift]:
                    measure(runner, config, scenario, plan, fleet, results[scenario][config])
            print(f"round {r + 1}/{plan.rounds} done; load average: {loadavg()}", flush=True)
        for scenario, cells in results.items():
            print_table(scenario, cells, plan)
    finally:
        fleet.plain.close()
        fleet.spec.close()


def main(argv: list[str]) -> int:
    plan = parse_args(argv)
    command = shlex.join([".venv/bin/python", "bench/lossless.py", *argv])
    signal.signal(signal.SIGTERM, on_sigterm)
    describe(plan, command)
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dg-lossless-") as tmp:
        try:
            with event_loop() as runner:
                run(Plan(**{**plan.__dict__, "work": Path(tmp)}), runner)
        except KeyboardInterrupt:
            print("\ninterrupted; stopping what this benchmark started", file=sys.stderr)
            return 130
    footnotes(time.monotonic() - began)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
