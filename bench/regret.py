"""How much the `auto` policy's decisions cost against an oracle: regret on load traces.

Run: .venv/bin/python bench/regret.py [--step-s 12] [--itl-objective-ms 6] [--traces diurnal,bursty]

A real `draftgate up` (five simulated backends of GPT-OSS-20B on B200, one per method: plain,
EAGLE-3, P-EAGLE, DFlash, DSpark; simulators at a fifth of real time) serves closed-loop
clients whose number follows a trace, one level per step:
- `diurnal`: a compressed day, 24 steps (an hour each) from 2 streams at 04:00 to 96 at 16:00
  along a raised cosine on a log scale. The shape is synthetic: published serving traces
  (Azure's LLM inference traces, BurstGPT) were not at hand offline; they show one daily
  peak several times the trough, which this follows.
- `bursty`: 24 short steps at 4 streams, with a seeded quarter of them bursts of 96.
Each request asks 256 output tokens (`ignore_eos`) of a short prompt. The gateway's loops
are compressed with the trace: selector every 0.5 s, dwell 4 s, collector every 1 s over 4 s
windows (production: 10 s, 60 s, 5 s): a step is to the selector what an hour or a burst
is in production.

Ground truth is the simulator's own model, not what the gateway measured: each method's
output tokens/s at each level, in virtual time (backends/sim/calibrate.run_closed_loop, the
same engine and step-time model the servers run, 256-token answers), gives its capacity cost
in $ per 1M output tokens at the demo's B200 price and its per-token latency (ITL = streams /
tokens/s). Every request `auto` served is priced at the method that served it, at its step's
level; the oracle serves each step's tokens on the method cheapest at that level among those
within the ITL objective (none within it: the fastest); each static method and plain serve
the same tokens at the same levels. Figures per trace, side by side: $ per 1M output tokens,
regret (policy / oracle - 1), the share of tokens served within the objective, and `auto`'s
moves (audit entries `switch`). Levels are per method's one backend (the demo has one each).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import math
import random
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tests' real servers

from backends.sim.calibrate import run_closed_loop
from backends.sim.config import SimConfig
from tests.e2e.conftest import Server, draftgate_env, free_port, free_port_block, spawn_server

MODEL = "openai/gpt-oss-20b"
GPU = "B200"
METHODS = ("plain", "eagle3", "p-eagle", "dflash", "dspark")
ANSWER_TOKENS = 256
PROMPT = "Summarise the plot of a long novel about a lighthouse keeper."
TIME_SCALE = 0.2
GROUND_TRUTH_STEPS = 1500


def diurnal(low: int = 2, high: int = 96) -> list[int]:
    """Streams per hour of a day: the trough at 04:00, the peak at 16:00."""
    shape = [(1 - math.cos(2 * math.pi * (hour - 4) / 24)) / 2 for hour in range(24)]
    return [round(low * (high / low) ** s) for s in shape]


def bursty(base: int = 4, burst: int = 96, share: float = 0.25, seed: int = 7) -> list[int]:
    """Short steps at `base` streams, a seeded `share` of them bursts."""
    rng = random.Random(seed)
    return [burst if rng.random() < share else base for _ in range(24)]


TRACES = {"diurnal": (diurnal, 1.0), "bursty": (bursty, 0.4)}  # step length, relative


@cache
def truth(method: str, streams: int, prompt_tokens: int) -> tuple[float, float]:
    """(output tokens/s, ITL ms) of one backend of `method` at `streams`, by the simulator's
    model in virtual time."""
    config = SimConfig(model=MODEL, method=method, gpu=GPU)
    result = run_closed_loop(
        config, streams, GROUND_TRUTH_STEPS, shape=(prompt_tokens, ANSWER_TOKENS)
    )
    return result.output_tokens_per_s, 1000 * streams / result.output_tokens_per_s


@dataclass
class Served:
    step: int
    method: str
    tokens: int


@dataclass
class Load:
    """Closed-loop clients whose number follows the trace's level."""

    base_url: str
    key: str
    target: int = 0
    step: int = 0
    served: list[Served] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    async def worker(self, http: httpx.AsyncClient, index: int) -> None:
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": ANSWER_TOKENS,
            "ignore_eos": True,
        }
        while index < self.target:
            step = self.step
            try:
                response = await http.post("/v1/chat/completions", json=body)
            except httpx.HTTPError as exc:
                self.failures.append(repr(exc))
                continue
            if response.status_code != 200:
                self.failures.append(f"{response.status_code} {response.text[:200]}")
                continue
            tokens = response.json()["usage"]["completion_tokens"]
            self.served.append(Served(step, response.headers["x-draftgate-method"], tokens))

    async def run(self, levels: list[int], step_s: float) -> None:
        headers = {"Authorization": f"Bearer {self.key}"}
        limits = httpx.Limits(max_connections=max(levels) + 8)
        async with httpx.AsyncClient(
            base_url=self.base_url, headers=headers, limits=limits, timeout=300
        ) as http:
            workers: dict[int, asyncio.Task[None]] = {}
            for step, level in enumerate(levels):
                self.step, self.target = step, level
                for index in range(level):
                    if index not in workers or workers[index].done():
                        workers[index] = asyncio.create_task(self.worker(http, index))
                await asyncio.sleep(step_s)
            self.target = 0
            await asyncio.gather(*workers.values())


def start_up(directory: Path) -> tuple[Server, str, str]:
    env = draftgate_env(
        DRAFTGATE_DATABASE_URL=f"sqlite:///{directory}/regret.db",
        DRAFTGATE_SELECTOR_INTERVAL_S="0.5",
        DRAFTGATE_SELECTOR_MIN_DWELL_S="4",
        DRAFTGATE_COLLECT_INTERVAL_S="1",
        DRAFTGATE_MEASUREMENT_WINDOW_S="4",
    )
    server = spawn_server(
        ("up", "--sim-base-port", str(free_port_block(5)), "--time-scale", str(TIME_SCALE),
         "--no-dashboard"),
        env, directory, port=free_port(),
    )  # fmt: skip
    server.wait_healthy(120)
    token = server.wait_for_output(r"^\s*admin token\s+(\S+)\s*$").group(1)
    key = server.wait_for_output(r"^\s*demo API key\s+(\S+)").group(1)
    return server, token, key


def switches(admin: httpx.Client, since: float) -> int:
    params = {"resource_type": "model", "resource_id": MODEL}
    entries = admin.get("/admin/v1/audit", params=params).json()["data"]
    return sum(
        e["action"] == "switch" and dt.datetime.fromisoformat(e["at"]).timestamp() >= since
        for e in entries
    )


def report(
    name: str, levels: list[int], load: Load, usd_per_gpu_hour: float, objective_ms: float,
    prompt_tokens: int, moves: int,
) -> None:  # fmt: skip
    def usd_per_mtok(method: str, streams: int) -> float:
        tokens_per_s, _ = truth(method, streams, prompt_tokens)
        return usd_per_gpu_hour / 3600 / tokens_per_s * 1e6

    def within(method: str, streams: int) -> bool:
        return truth(method, streams, prompt_tokens)[1] <= objective_ms

    def oracle(streams: int) -> str:
        meeting = [m for m in METHODS if within(m, streams)]
        if not meeting:
            return min(METHODS, key=lambda m: truth(m, streams, prompt_tokens)[1])
        return min(meeting, key=lambda m: usd_per_mtok(m, streams))

    served = [s for s in load.served if s.step < len(levels)]
    total = sum(s.tokens for s in served)
    rows: dict[str, tuple[float, float]] = {}  # policy: (usd, tokens within)

    def add(policy: str, pick: Callable[[Served], str]) -> None:
        usd = within_tokens = 0.0
        for s in served:
            method, streams = pick(s), levels[s.step]
            usd += s.tokens * usd_per_mtok(method, streams) / 1e6
            within_tokens += s.tokens * within(method, streams)
        rows[policy] = (usd, within_tokens)

    add("auto", lambda s: s.method)
    add("oracle", lambda s: oracle(levels[s.step]))
    for method in METHODS:
        add(f"static {method}" if method != "plain" else "plain", lambda s, m=method: m)
    best = rows["oracle"][0]
    print(f"\n{name}: levels {levels}; {len(served)} requests, {total} output tokens")
    print(f"{'policy':<16} {'$/1M out':>9} {'regret':>8} {'within ITL':>11}")
    for policy, (usd, within_tokens) in rows.items():
        per_mtok = usd / total * 1e6
        print(f"{policy:<16} {per_mtok:9.4f} {usd / best - 1:8.1%} {within_tokens / total:11.1%}")
    print(f"auto's moves: {moves}; served by method: "
          f"{ {m: sum(s.tokens for s in served if s.method == m) for m in METHODS} }")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--step-s", type=float, default=12.0, help="seconds per diurnal step")
    parser.add_argument("--itl-objective-ms", type=float, default=6.0)
    parser.add_argument("--traces", default="diurnal,bursty")
    args = parser.parse_args()
    print("command: .venv/bin/python bench/regret.py " + " ".join(sys.argv[1:]))
    with tempfile.TemporaryDirectory() as directory:
        server, token, key = start_up(Path(directory))
        try:
            with httpx.Client(
                base_url=server.base_url, headers={"Authorization": f"Bearer {token}"}
            ) as admin:
                policy = {"mode": "auto", "itl_objective_ms": args.itl_objective_ms}
                answer = admin.put(f"/admin/v1/models/{MODEL}/policy", json=policy)
                answer.raise_for_status()
                prices = admin.get("/admin/v1/prices").json()["data"]
                price = min(p["usd_per_gpu_hour"] for p in prices if p["gpu_type"] == GPU)
                probe = httpx.post(
                    f"{server.base_url}/v1/chat/completions",
                    headers={"Authorization": f"Bearer {key}"},
                    json={"model": MODEL, "messages": [{"role": "user", "content": PROMPT}],
                          "max_tokens": 1},
                    timeout=60,
                )  # fmt: skip
                prompt_tokens = probe.json()["usage"]["prompt_tokens"]
                print(f"B200 at ${price}/GPU-hour (the demo's price); ITL objective "
                      f"{args.itl_objective_ms} ms; prompt {prompt_tokens} tokens, "
                      f"answers {ANSWER_TOKENS}")  # fmt: skip
                for name in args.traces.split(","):
                    make, relative = TRACES[name]
                    levels = make()
                    since = time.time()
                    load = Load(server.base_url, key)
                    asyncio.run(load.run(levels, args.step_s * relative))
                    report(name, levels, load, price, args.itl_objective_ms, prompt_tokens,
                           switches(admin, since))  # fmt: skip
                    if load.failures:
                        print(f"failures: {len(load.failures)}: {load.failures[:3]}")
        finally:
            server.close()


if __name__ == "__main__":
    main()
