"""How much the `auto` policy's decisions cost against an oracle: regret on load traces.

Run: .venv/bin/python bench/regret.py [--step-s 12] [--itl-objective-ms 6] [--time-scale 0.2]
     [--traces diurnal,bursty] [--without-spill bursty] [--without-load-window diurnal,bursty]
     [--served-oracle diurnal,bursty] [--warm-s 6]

A real `draftgate up` (five simulated backends of GPT-OSS-20B on B200, one per method: plain,
EAGLE-3, P-EAGLE, DFlash, DSpark; simulators at a fifth of real time) serves closed-loop
clients whose number follows a trace, one level per step:
- `diurnal`: a compressed day, 24 steps (an hour each) from 2 streams at 04:00 to 96 at 16:00
  along a raised cosine on a log scale. The shape is synthetic: published serving traces
  (Azure's LLM inference traces, BurstGPT) were not at hand offline; they show one daily
  peak several times the trough, which this follows.
- `bursty`: 24 short steps at 4 streams, with a seeded quarter of them bursts of 96.
Each request asks 256 output tokens (`ignore_eos`) of a short prompt. The gateway's loops
are compressed with the trace: selector every 0.5 s, dwell 4 s, move steps 1 s, collector
every 1 s over 4 s windows (production: 10 s, 60 s, 15 s, 5 s): a step is to the selector
what an hour or a burst is in production. `auto` runs with per-request spill and a 20 s
load window (`CONFIGS`), and beside it without spill and without the window, every run on a
fresh stack. Before each trace every backend is benchmarked at 1-96 streams (`--warm-s` per
level), as a fleet that has served a while has its curves measured; the simulators' latencies
reach the gateway in wall time, so its ITL objective is the bench's over `--time-scale`.

The oracle is also served (`--served-oracle`): the same trace through a fresh stack whose
policy is pinned, at each step's start, to the method the simulator's model says is best at
the step's level. It moves with hindsight and no lag, but pays what every real move pays:
the old pool drains its requests while the new one fills. `auto` against it is what its
decisions cost; the served oracle against the oracle is what moving at all costs.

Ground truth is the simulator's own model, not what the gateway measured: each method's
output tokens/s at each level, in virtual time (backends/sim/calibrate.run_closed_loop, the
same engine and step-time model the servers run, 256-token answers), gives its capacity cost
in $ per 1M output tokens at the demo's B200 price and its per-token latency (ITL = streams /
tokens/s). Every request `auto` served is priced at the method that served it, at the
streams its backend served over the request's life (the requests' time on it in each step
over the step: a move leaves two pools half loaded while the old one drains); the oracle
serves each request on the method cheapest at all the streams of its life among those within
the ITL objective (none within it: the fastest); each static method and plain serve the same
requests at all the streams. Figures per trace, side by side: $ per 1M output tokens, regret
(policy / its own run's oracle - 1), the share of tokens served within the objective, and
`auto`'s moves (audit entries `switch`) and spilled requests; then `auto`'s regret step by
step (the methods it served with, the oracle's, each step's share of the regret). Levels are
per method's one backend (the demo has one each).
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
from collections.abc import Awaitable, Callable
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
TIME_SCALE = 0.2  # simulated time per wall second (--time-scale; 1: real time)
GROUND_TRUTH_STEPS = 1500
WARM_LEVELS = [1, 4, 16, 48, 96]  # where each method is benchmarked before a trace (--warm-s)


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
    start: float  # monotonic seconds
    end: float


@dataclass
class Load:
    """Closed-loop clients whose number follows the trace's level."""

    base_url: str
    key: str
    target: int = 0
    step: int = 0
    step_starts: list[float] = field(default_factory=list)  # monotonic, and the end last
    served: list[Served] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    # Called at each step's start with its level (the served oracle pins its method there)
    on_step: Callable[[int], Awaitable[None]] | None = None

    async def worker(self, http: httpx.AsyncClient, index: int) -> None:
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": ANSWER_TOKENS,
            "ignore_eos": True,
        }
        while index < self.target:
            step, start = self.step, time.monotonic()
            try:
                response = await http.post("/v1/chat/completions", json=body)
            except httpx.HTTPError as exc:
                self.failures.append(repr(exc))
                continue
            if response.status_code != 200:
                self.failures.append(f"{response.status_code} {response.text[:200]}")
                continue
            tokens = response.json()["usage"]["completion_tokens"]
            method = response.headers["x-draftgate-method"]
            self.served.append(Served(step, method, tokens, start, time.monotonic()))

    async def run(self, levels: list[int], step_s: float) -> None:
        headers = {"Authorization": f"Bearer {self.key}"}
        limits = httpx.Limits(max_connections=max(levels) + 8)
        async with httpx.AsyncClient(
            base_url=self.base_url, headers=headers, limits=limits, timeout=300
        ) as http:
            workers: dict[int, asyncio.Task[None]] = {}
            for step, level in enumerate(levels):
                if self.on_step is not None:
                    await self.on_step(level)
                self.step, self.target = step, level
                self.step_starts.append(time.monotonic())
                for index in range(level):
                    if index not in workers or workers[index].done():
                        workers[index] = asyncio.create_task(self.worker(http, index))
                await asyncio.sleep(step_s)
            self.step_starts.append(time.monotonic())
            self.target = 0
            await asyncio.gather(*workers.values())

    def levels(self) -> list[tuple[Served, int, int]]:
        """Each request served in the trace with the streams its method's backend served
        over its life, and the streams all backends served (what one method would have had
        alone): per step the requests' time on each backend within the step's window over
        the window, weighted by the request's time in each step (at least 1)."""
        edges = self.step_starts
        busy: dict[tuple[int, str], float] = {}
        for s in self.served:
            for step, overlap in _overlaps(s, edges):
                busy[(step, s.method)] = busy.get((step, s.method), 0.0) + overlap
        pool = {key: seconds / (edges[key[0] + 1] - edges[key[0]]) for key, seconds in busy.items()}
        total: dict[int, float] = {}
        for (step, _), streams in pool.items():
            total[step] = total.get(step, 0.0) + streams
        found = []
        for s in self.served:
            weights = _overlaps(s, edges)
            if not weights:
                continue
            life = sum(w for _, w in weights)
            own = sum(w * pool[(step, s.method)] for step, w in weights) / life
            every = sum(w * total[step] for step, w in weights) / life
            found.append((s, max(1, round(own)), max(1, round(every))))
        return found


def _overlaps(s: Served, edges: list[float]) -> list[tuple[int, float]]:
    """The seconds of the request's life within each step's window (the trace's only)."""
    found = []
    for step in range(len(edges) - 1):
        overlap = min(s.end, edges[step + 1]) - max(s.start, edges[step])
        if overlap > 0:
            found.append((step, overlap))
    return found


SERVED_ORACLE = "oracle, served"

# The gateway's configurations side by side: `auto` as recommended (spill on, a load window
# of 20 s: five dwell times, as 300 s is to production's 60 s), then each without one part,
# on the traces it matters for.
CONFIGS = {
    "auto": {"DRAFTGATE_SPILL": "true", "DRAFTGATE_SELECTOR_LOAD_WINDOW_S": "20"},
    "auto, no spill": {"DRAFTGATE_SPILL": "false", "DRAFTGATE_SELECTOR_LOAD_WINDOW_S": "20"},
    "auto, no load window": {"DRAFTGATE_SPILL": "true", "DRAFTGATE_SELECTOR_LOAD_WINDOW_S": "0"},
    # The oracle served: pinned, at each step's start, to the method the simulator's model
    # says is best at its level (hindsight, no lag), so it pays a move's drain as `auto` does
    SERVED_ORACLE: {"DRAFTGATE_SPILL": "false", "DRAFTGATE_SELECTOR_LOAD_WINDOW_S": "0"},
}


def start_up(directory: Path, config: dict[str, str], time_scale: float) -> tuple[Server, str, str]:
    env = draftgate_env(
        DRAFTGATE_DATABASE_URL=f"sqlite:///{directory}/regret.db",
        DRAFTGATE_SELECTOR_INTERVAL_S="0.5",
        DRAFTGATE_SELECTOR_MIN_DWELL_S="4",
        DRAFTGATE_COLLECT_INTERVAL_S="1",
        DRAFTGATE_MEASUREMENT_WINDOW_S="4",
        DRAFTGATE_MOVE_STEP_S="1",
        **config,
    )
    server = spawn_server(
        ("up", "--sim-base-port", str(free_port_block(5)), "--time-scale", str(time_scale),
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


@dataclass
class Run:
    """One trace served through one gateway: what each request was served by, and when."""

    levels: list[int]
    load: Load
    moves: int
    spills: int
    said: list[str] = field(default_factory=list)  # the gateway's log of its choices


@dataclass
class Truth:
    """The simulator's model at the bench's price, prompt and objective."""

    usd_per_gpu_hour: float
    objective_ms: float
    prompt_tokens: int

    def usd_per_mtok(self, method: str, streams: int) -> float:
        tokens_per_s, _ = truth(method, streams, self.prompt_tokens)
        return self.usd_per_gpu_hour / 3600 / tokens_per_s * 1e6

    def within(self, method: str, streams: int) -> bool:
        return truth(method, streams, self.prompt_tokens)[1] <= self.objective_ms

    def oracle(self, streams: int) -> str:
        meeting = [m for m in METHODS if self.within(m, streams)]
        if not meeting:
            return min(METHODS, key=lambda m: truth(m, streams, self.prompt_tokens)[1])
        return min(meeting, key=lambda m: self.usd_per_mtok(m, streams))

    def cost(
        self, served: list[tuple[Served, int, int]], pick: Callable[[Served, int, int], str]
    ) -> tuple[float, float, int]:
        """($, tokens within the objective, tokens) of the requests served by the method
        `pick` names for each (from the request, its pool's streams and all streams): `auto`'s
        own method at its pool's streams, any other at all the streams (it would have served
        them alone)."""
        usd = within_tokens = 0.0
        for s, own, every in served:
            method = pick(s, own, every)
            streams = own if pick is _served_by else every
            usd += s.tokens * self.usd_per_mtok(method, streams) / 1e6
            within_tokens += s.tokens * self.within(method, streams)
        return usd, within_tokens, sum(s.tokens for s, _, _ in served)


def _served_by(s: Served, own: int, every: int) -> str:
    return s.method


def report(name: str, runs: dict[str, Run], ground: Truth) -> None:
    """Side by side: auto (with spill, and without where it ran), the oracle, each static
    method and plain; regret against the oracle serving the same run's requests."""
    rows: dict[str, tuple[float, float, float, int]] = {}  # usd, within, regret, tokens
    first = runs["auto"].load.levels()
    oracle = lambda s, own, every: ground.oracle(every)  # noqa: E731
    for label, run in runs.items():
        served = first if label == "auto" else run.load.levels()
        usd, within, total = ground.cost(served, _served_by)
        best, _, _ = ground.cost(served, oracle)
        moves = f" ({run.moves} moves, {run.spills} spilled)"
        rows[label + moves] = (usd, within, usd / best - 1, total)
    best, within, total = ground.cost(first, oracle)
    rows["oracle"] = (best, within, 0.0, total)
    for method in METHODS:
        usd, within, total = ground.cost(first, lambda s, own, every, m=method: m)
        label = f"static {method}" if method != "plain" else "plain"
        rows[label] = (usd, within, usd / best - 1, total)
    print(f"\n{name}: levels {runs['auto'].levels}; {len(first)} requests")
    print(f"{'policy':<36} {'$/1M out':>9} {'regret':>8} {'within ITL':>11}")
    for policy, (usd, within_tokens, regret, total) in rows.items():
        print(f"{policy:<36} {usd / total * 1e6:9.4f} {regret:8.1%} {within_tokens / total:11.1%}")
    baseline = next((k for k in rows if k.startswith(SERVED_ORACLE)), None)
    if baseline is not None:  # what a policy that must drain its moves could at best have done
        usd, _, _, total = rows[baseline]
        against = [
            f"{label.split(' (')[0]} {mine / tokens / (usd / total) - 1:+.1%}"
            for label, (mine, _, _, tokens) in rows.items()
            if label.startswith("auto")
        ]
        print(f"against the oracle served ({usd / total * 1e6:.4f}): " + ", ".join(against))
    attribute(first, ground, runs["auto"].levels)
    for label, run in runs.items():
        by_method = {m: sum(s.tokens for s in run.load.served if s.method == m) for m in METHODS}
        print(f"{label}: tokens by method {by_method}")
        for line in run.said:
            print(f"{label}: {line}")
        if run.load.failures:
            print(f"{label}: failures: {len(run.load.failures)}: {run.load.failures[:3]}")


def attribute(served: list[tuple[Served, int, int]], ground: Truth, levels: list[int]) -> None:
    """`auto`'s regret step by step (by the step each request was sent in): the methods it
    served with and the oracle's, and each step's share of the whole regret, so a lag at
    the crossover shows apart from a crossover placed wrong."""
    oracle_usd = sum(s.tokens * ground.usd_per_mtok(ground.oracle(every), every) / 1e6
                     for s, _, every in served)  # fmt: skip
    print(f"{'step':>4} {'streams':>7} {'auto served (tokens)':<44} {'oracle':<8} "
          f"{'auto $/1M':>9} {'oracle':>8} {'of regret':>9}")  # fmt: skip
    for step, level in enumerate(levels):
        mine = [(s, own, every) for s, own, every in served if s.step == step]
        tokens = sum(s.tokens for s, _, _ in mine)
        if not tokens:
            continue
        auto_usd = sum(s.tokens * ground.usd_per_mtok(s.method, own) / 1e6 for s, own, _ in mine)
        best_usd = sum(s.tokens * ground.usd_per_mtok(ground.oracle(every), every) / 1e6
                       for s, _, every in mine)  # fmt: skip
        by_method: dict[str, int] = {}
        for s, _, _ in mine:
            by_method[s.method] = by_method.get(s.method, 0) + s.tokens
        names = ", ".join(f"{m} {n}" for m, n in sorted(by_method.items(), key=lambda i: -i[1]))
        oracles = {ground.oracle(every) for _, _, every in mine}
        print(f"{step:>4} {level:>7} {names[:44]:<44} {'/'.join(sorted(oracles)):<8} "
              f"{auto_usd / tokens * 1e6:9.4f} {best_usd / tokens * 1e6:8.4f} "
              f"{(auto_usd - best_usd) / oracle_usd:9.2%}")  # fmt: skip


def choices_said(directory: Path) -> list[str]:
    """The gateway's log lines of `auto`'s first choice and moves, with the prices it moved
    on (a run's stack is temporary: these keep them)."""
    return [
        line.strip()
        for log in sorted(directory.rglob("gateway.log"))
        for line in log.read_text(errors="replace").splitlines()
        if "auto: " in line
    ]


def spills(server: Server) -> int:
    found = httpx.get(f"{server.base_url}/metrics").text
    return int(sum(
        float(line.rsplit(" ", 1)[1]) for line in found.splitlines()
        if line.startswith("draftgate_fallbacks_total{") and 'reason="spill"' in line
    ))  # fmt: skip


def pin_oracle(
    base_url: str, token: str, ground: Truth, pins: list[str]
) -> Callable[[int], Awaitable[None]]:
    """The served oracle's step: pin the model to the best method at the step's level (each
    change of method appended to `pins`)."""

    async def pin(level: int) -> None:
        method = ground.oracle(level)
        if pins and pins[-1] == method:
            return
        pins.append(method)
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(base_url=base_url, headers=headers) as admin:
            policy = {"mode": "pinned", "method": method}
            (await admin.put(f"/admin/v1/models/{MODEL}/policy", json=policy)).raise_for_status()

    return pin


def warm(admin: httpx.Client, levels: list[int], seconds: float) -> None:
    """Benchmark every backend at `levels` (output as the trace's), one after another, so each
    method's curve is measured where the trace runs it. Without this, a method's curve is the
    planner's estimate at full speed until traffic measures it; with the simulators run slower
    than real time (`--time-scale`), a measured point is that many times slower, and a method
    once measured looked that much dearer than one not yet measured."""
    for backend in admin.get("/admin/v1/backends").json()["data"]:
        body = {"backend": backend["name"], "concurrency": levels, "duration_s": seconds,
                "output_len": ANSWER_TOKENS}  # fmt: skip
        run = admin.post("/admin/v1/benchmarks", json=body)
        run.raise_for_status()
        deadline = time.monotonic() + 60 * len(levels) * seconds
        while admin.get(f"/admin/v1/benchmarks/{run.json()['id']}").json()["status"] in {
            "queued",
            "running",
        }:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the benchmark of {backend['name']} did not end")
            time.sleep(0.5)


def serve(directory: Path, label: str, traces: list[str], step_s: float, objective_ms: float,
          time_scale: float, warm_s: float) -> tuple[dict[str, Run], Truth]:  # fmt: skip
    """Run `traces` through a fresh `draftgate up` in one configuration."""
    config = CONFIGS[label]
    directory.mkdir()
    server, token, key = start_up(directory, config, time_scale)
    runs: dict[str, Run] = {}
    try:
        with httpx.Client(
            base_url=server.base_url, headers={"Authorization": f"Bearer {token}"}
        ) as admin:
            # The simulators' latencies reach the gateway in wall time, `1 / time_scale` times
            # the simulated (the ground truth's): the objective it is given is scaled alike
            policy = {"mode": "auto", "itl_objective_ms": objective_ms / time_scale}
            admin.put(f"/admin/v1/models/{MODEL}/policy", json=policy).raise_for_status()
            prices = admin.get("/admin/v1/prices").json()["data"]
            price = min(p["usd_per_gpu_hour"] for p in prices if p["gpu_type"] == GPU)
            probe = httpx.post(
                f"{server.base_url}/v1/chat/completions",
                headers={"Authorization": f"Bearer {key}"},
                json={"model": MODEL, "messages": [{"role": "user", "content": PROMPT}],
                      "max_tokens": 1},
                timeout=60,
            )  # fmt: skip
            ground = Truth(price, objective_ms, probe.json()["usage"]["prompt_tokens"])
            if warm_s > 0:
                warm(admin, WARM_LEVELS, warm_s)
            for name in traces:
                make, relative = TRACES[name]
                levels = make()
                since, spilled_before = time.time(), spills(server)
                load, pins = Load(server.base_url, key), list[str]()
                if label == SERVED_ORACLE:
                    load.on_step = pin_oracle(server.base_url, token, ground, pins)
                asyncio.run(load.run(levels, step_s * relative))
                moves, spilled = switches(admin, since), spills(server) - spilled_before
                moves += max(0, len(pins) - 1)  # the served oracle's moves are its pins
                runs[name] = Run(levels, load, moves, spilled, choices_said(directory))
    finally:
        server.close()
    return runs, ground


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--step-s", type=float, default=12.0, help="seconds per diurnal step")
    parser.add_argument("--itl-objective-ms", type=float, default=6.0)
    parser.add_argument(
        "--time-scale", type=float, default=TIME_SCALE, help="the simulators' speed (1: real time)"
    )
    parser.add_argument("--traces", default="diurnal,bursty")
    parser.add_argument("--without-spill", default="bursty", help="traces ('' none)")
    parser.add_argument("--without-load-window", default="diurnal,bursty", help="traces")
    parser.add_argument(
        "--warm-s", type=float, default=6.0, help="seconds per level of the sweeps before (0: none)"
    )
    parser.add_argument(
        "--served-oracle", default="diurnal,bursty", help="traces to serve the oracle on ('' none)"
    )
    args = parser.parse_args()
    print("command: .venv/bin/python bench/regret.py " + " ".join(sys.argv[1:]))
    traces = args.traces.split(",")
    each = {
        "auto": traces,
        "auto, no spill": [t for t in args.without_spill.split(",") if t in traces],
        "auto, no load window": [t for t in args.without_load_window.split(",") if t in traces],
        SERVED_ORACLE: [t for t in args.served_oracle.split(",") if t in traces],
    }
    runs: dict[str, dict[str, Run]] = {name: {} for name in traces}  # by trace, then config
    with tempfile.TemporaryDirectory() as directory:  # a fresh stack for every run
        for name in traces:
            for label, its_traces in each.items():
                if name in its_traces:
                    done, ground = serve(Path(directory, f"{name}-{len(runs[name])}"),
                                         label, [name], args.step_s,
                                         args.itl_objective_ms, args.time_scale,
                                         args.warm_s)  # fmt: skip
                    runs[name][label] = done[name]
    print(f"B200 at ${ground.usd_per_gpu_hour}/GPU-hour (the demo's price); ITL objective "
          f"{ground.objective_ms} ms; prompt {ground.prompt_tokens} tokens, answers "
          f"{ANSWER_TOKENS}")  # fmt: skip
    for name in traces:
        report(name, runs[name], ground)


if __name__ == "__main__":
    main()
