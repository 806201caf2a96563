"""What cache affinity buys: TTFT and prefix-cache hit rate, affinity on vs off, side by side.

Starts three plain simulators of one model at time scale 1 (their KV cache cut down with
--gpu-memory-utilization so that a pool's working set does not fit one backend) and two
gateways in front of the same three, one with DRAFTGATE_AFFINITY=false. Each workload runs
once per gateway on fresh text (no run finds another's prefixes cached), the gateways in
turn, and prints client-side TTFT p50/p99 of streamed chat turns and the hit rate the
simulators' own vllm:prefix_cache_hits / vllm:prefix_cache_queries counted meanwhile.

Workloads:
- multi-turn: sessions of several turns, each turn repeating the whole conversation so far
  (a unique opening, then each reply and a new question), all sessions at once;
- shared-system: single-turn requests behind one long shared system prompt.

Then a method move under multi-turn load: three P-EAGLE simulators join the pool and the
affinity gateway's model, pinned to plain, is pinned to P-EAGLE a few seconds into the run,
once in steps (DRAFTGATE_MOVE_STEP_SHARE 0.25 every 1 s) and once with ?immediate=true;
TTFT p50/p99 of the turns sent from the move on, and the hit rate over the run.

Run: .venv/bin/python bench/affinity.py [--sessions 48 --turns 6 --rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SIM = ["--model", MODEL, "--gpu", "H100", "--gpu-memory-utilization", "0.3"]  # 64k tokens of KV
DRAFTGATE = Path(sys.executable).parent / "draftgate"
WORDS = "alpha beta gamma delta kernel cache token stream batch queue".split()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def processes(log_dir: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes started in their own sessions, stopped as groups at the end."""
    started: list[subprocess.Popen[bytes]] = []
    try:
        yield started
    finally:
        for proc in started:
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in started:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def start(
    started: list[subprocess.Popen[bytes]], name: str, argv: list[str], env: dict[str, str],
    log_dir: Path,
) -> None:  # fmt: skip
    log = (log_dir / f"{name}.log").open("wb")
    proc = subprocess.Popen(  # noqa: S603 (our own commands)
        argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    started.append(proc)


def wait_healthy(url: str, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with suppress(httpx.TransportError):
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise SystemExit(f"{url} did not become healthy in {timeout_s:.0f} s")


def text(seed: str, words: int) -> str:
    """Distinct filler text: `seed` makes it unlike any other run's."""
    return " ".join(f"{seed}{WORDS[i % len(WORDS)]}{i}" for i in range(words))


@dataclass
class Run:
    ttft_s: list[float] = field(default_factory=list)
    failures: int = 0


async def turn(
    client: httpx.AsyncClient, messages: list[dict[str, str]], run: Run, timed: bool = True
) -> str:
    """One streamed chat turn; records its TTFT (if `timed`) and returns the reply's text."""
    body = {"model": MODEL, "messages": messages, "max_tokens": 32, "stream": True}
    started = time.perf_counter()
    first: float | None = None
    parts: list[str] = []
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            run.failures += 1
            await response.aread()
            return ""
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            choices = orjson.loads(line[6:]).get("choices") or []
            content = choices[0].get("delta", {}).get("content") if choices else None
            if content:
                first = first or time.perf_counter()
                parts.append(content)
    if first is None:
        run.failures += 1
        return ""
    if timed:
        run.ttft_s.append(first - started)
    return "".join(parts)


async def session(
    client: httpx.AsyncClient, seed: str, turns: int, run: Run, after: float = 0.0
) -> None:
    messages = [
        {"role": "system", "content": text(f"{seed}s", 800)},
        {"role": "user", "content": text(f"{seed}u", 40)},
    ]
    for i in range(turns):
        reply = await turn(client, messages, run, timed=time.monotonic() >= after)
        messages += [
            {"role": "assistant", "content": reply},
            {"role": "user", "content": text(f"{seed}q{i}", 40)},
        ]


async def multi_turn(url: str, seed: str, sessions: int, turns: int) -> Run:
    run = Run()
    async with httpx.AsyncClient(base_url=url, timeout=120.0) as client:
        await asyncio.gather(*(session(client, f"{seed}{n}x", turns, run) for n in range(sessions)))
    return run


ADMIN = {"authorization": "Bearer bench-admin-token-0123456789"}


def pin(url: str, method: str, immediate: bool) -> None:
    params = {"immediate": "true"} if immediate else {}
    body = {"mode": "pinned", "method": method}
    path = f"{url}/admin/v1/models/{MODEL}/policy"
    httpx.put(path, json=body, params=params, headers=ADMIN, timeout=30).raise_for_status()


async def during_a_move(url: str, seed: str, sessions: int, turns: int, immediate: bool) -> Run:
    """Multi-turn load on plain; `MOVE_AFTER_S` in, the model is pinned to P-EAGLE. Only the
    turns sent from the move on are timed."""
    pin(url, "plain", immediate=True)
    run = Run()
    moved_at = time.monotonic() + MOVE_AFTER_S

    async def move() -> None:
        await asyncio.sleep(MOVE_AFTER_S)
        await asyncio.to_thread(pin, url, "p-eagle", immediate)

    async with httpx.AsyncClient(base_url=url, timeout=120.0) as client:
        talks = (session(client, f"{seed}{n}m", turns, run, moved_at) for n in range(sessions))
        await asyncio.gather(move(), *talks)
    pin(url, "plain", immediate=True)  # back, for the next round's other workloads
    return run


MOVE_AFTER_S = 1.5


async def shared_system(url: str, seed: str, requests: int, concurrency: int) -> Run:
    run = Run()
    system = {"role": "system", "content": text(f"{seed}sys", 2000)}
    queue = list(range(requests))

    async def worker(client: httpx.AsyncClient) -> None:
        while queue:
            n = queue.pop()
            await turn(client, [system, {"role": "user", "content": text(f"{seed}{n}u", 30)}], run)

    async with httpx.AsyncClient(base_url=url, timeout=120.0) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    return run


def cache_counters(sims: list[str]) -> tuple[float, float]:
    """Σ queries and hits of vLLM's prefix-cache counters over the simulators."""
    queries = hits = 0.0
    for url in sims:
        for line in httpx.get(f"{url}/metrics", timeout=5).text.splitlines():
            if line.startswith("vllm:prefix_cache_queries_total{"):
                queries += float(line.rsplit(" ", 1)[1])
            elif line.startswith("vllm:prefix_cache_hits_total{"):
                hits += float(line.rsplit(" ", 1)[1])
    return queries, hits


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def print_results(results: dict[tuple[str, str], list[tuple[Run, float]]]) -> None:
    """One row per workload and routing: turns, failures, TTFT and the prefix-cache hit rate."""
    print(f"\n{'workload':<14} {'routing':<10} {'turns':>6} {'fail':>5} {'TTFT p50 ms':>12} "
          f"{'TTFT p99 ms':>12} {'hit rate':>9}   p50 vs the first row")  # fmt: skip
    for workload, modes in (
        ("multi-turn", ("load only", "affinity")),
        ("shared-system", ("load only", "affinity")),
        ("move", ("immediate", "gradual")),
    ):
        base = None
        for mode in modes:
            runs = results[(workload, mode)]
            ttft = [t for run, _ in runs for t in run.ttft_s]
            fails = sum(run.failures for run, _ in runs)
            rate = statistics.mean(rate for _, rate in runs)
            p50, p99 = percentile(ttft, 0.5) * 1e3, percentile(ttft, 0.99) * 1e3
            base = base or p50
            print(f"{workload:<14} {mode:<10} {len(ttft):>6} {fails:>5} {p50:>12.1f} "
                  f"{p99:>12.1f} {rate:>9.1%}   {p50 / base:.2f}x")  # fmt: skip


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=48)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--shared-requests", type=int, default=240)
    parser.add_argument("--shared-concurrency", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    print("command: .venv/bin/python bench/affinity.py " + " ".join(argv))
    print(f"3 plain simulators of {MODEL} on H100 (KV at --gpu-memory-utilization 0.3), "
          "time scale 1; two gateways over them")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp, processes(Path(tmp)) as started:
        work = Path(tmp)
        sims = []
        for i in range(3):
            port = free_port()
            argv_sim = [str(DRAFTGATE), "sim", *SIM, "--port", str(port), "--seed", str(i)]
            start(started, f"sim-{i}", argv_sim, dict(os.environ), work)
            sims.append(f"http://127.0.0.1:{port}")
        speculative = []
        for i in range(3):
            port = free_port()
            argv_sim = [str(DRAFTGATE), "sim", *SIM, "--method", "p-eagle", "--k", "5",
                        "--port", str(port), "--seed", str(10 + i)]  # fmt: skip
            start(started, f"sim-p-eagle-{i}", argv_sim, dict(os.environ), work)
            speculative.append(f"http://127.0.0.1:{port}")
        plain_lines = [
            f'  - {{name: sim-{i}, url: "{u}", model: {MODEL}, method: plain, gpu_type: H100}}'
            for i, u in enumerate(sims)
        ]
        spec_lines = [
            f'  - {{name: sim-p-eagle-{i}, url: "{u}", model: {MODEL}, method: p-eagle, k: 5, '
            "drafter: bench/Llama-3.1-8B-P-EAGLE, "
            "gpu_type: H100}"
            for i, u in enumerate(speculative)
        ]
        pinned = f"models:\n  - {{name: {MODEL}, policy: {{mode: pinned, method: plain}}}}\n"
        fleets = {}
        for name, lines in (("plain", plain_lines), ("both", plain_lines + spec_lines)):
            fleets[name] = work / f"fleet-{name}.yaml"
            fleets[name].write_text("backends:\n" + "\n".join(lines) + "\n" + pinned)
        gateways = {}
        for mode, on in (("affinity", "true"), ("load only", "false")):
            port = free_port()
            env = dict(os.environ) | {
                "DRAFTGATE_ADMIN_TOKEN": "bench-admin-token-0123456789",
                "DRAFTGATE_REQUIRE_API_KEY": "false",
                "DRAFTGATE_DATABASE_URL": f"sqlite:///{work}/{on}.db",
                "DRAFTGATE_FLEET": str(fleets["both" if on == "true" else "plain"]),
                "DRAFTGATE_AFFINITY": on,
                "DRAFTGATE_MOVE_STEP_SHARE": "0.25",
                "DRAFTGATE_MOVE_STEP_S": "1",
            }
            start(
                started,
                f"gateway-{on}",
                [str(DRAFTGATE), "gateway", "--port", str(port)],
                env,
                work,
            )
            gateways[mode] = f"http://127.0.0.1:{port}"
        for url in [*sims, *speculative, *gateways.values()]:
            wait_healthy(url)
        time.sleep(2.0)  # the gateways' first probes mark the backends healthy
        results: dict[tuple[str, str], list[tuple[Run, float]]] = {}
        for r in range(args.rounds):
            for mode, url in gateways.items():
                seed = f"r{r}{mode[0]}"
                for workload in ("multi-turn", "shared-system"):
                    before = cache_counters(sims)
                    if workload == "multi-turn":
                        run = asyncio.run(multi_turn(url, seed, args.sessions, args.turns))
                    else:
                        run = asyncio.run(
                            shared_system(url, seed, args.shared_requests, args.shared_concurrency)
                        )
                    after = cache_counters(sims)
                    rate = (after[1] - before[1]) / max(after[0] - before[0], 1.0)
                    results.setdefault((workload, mode), []).append((run, rate))
            for kind, immediate in (("immediate", True), ("gradual", False)):
                pool = [*sims, *speculative]
                before = cache_counters(pool)
                url = gateways["affinity"]
                run = asyncio.run(
                    during_a_move(url, f"r{r}{kind}", args.sessions, args.turns + 6, immediate)
                )
                after = cache_counters(pool)
                rate = (after[1] - before[1]) / max(after[0] - before[0], 1.0)
                results.setdefault(("move", kind), []).append((run, rate))
    print_results(results)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
