"""The benchmark runner: a load sweep against an OpenAI-compatible server.

At each concurrency level, requests (chat completions, streamed, `ignore_eos`, shaped by a
workload preset) go out either closed-loop (that many clients, each sending its next request
when the last one ends) or open-loop at a request rate (arrivals evenly spaced, or Poisson /
gamma as `vllm bench serve --request-rate --burstiness` makes them), with the level's
concurrency as the cap on requests in flight (its `--max-concurrency`); a level ends after a
number of requests or once its duration has passed and every request sent has finished.
The client times the first token, every chunk and the whole request. When the URL is a vLLM
server, its `/metrics` before and after each level give the acceptance as vLLM defines it.
Results print as a table and can be saved in `vllm bench serve`'s JSON format.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import random
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from backends.vllm_metrics import VllmSnapshot, difference, parse_metrics
from backends.workloads import DEFAULT_INPUT_LEN, DEFAULT_OUTPUT_LEN, BenchWorkload

# Neither a count nor a duration given: 50 requests per level and at least 8 per client
# (c=64 runs 512 requests, at 64 in flight but for the last few).
DEFAULT_REQUESTS_PER_LEVEL, DEFAULT_REQUESTS_PER_CLIENT = 50, 8


@dataclass(frozen=True)
class BenchConfig:
    """One sweep. Each level stops after `requests_per_level` requests, else `duration_s`."""

    url: str  # base URL without /v1
    model: str
    concurrency: tuple[int, ...]  # closed loop: clients; open loop: the cap on requests in flight
    requests_per_level: int | None = None
    duration_s: float | None = None  # closed loop: sending stops then; open loop: arrivals do
    # With a request count: at least this many requests per client at each level, so a level
    # of c clients runs at c in flight for most of it, not mostly ramping down.
    requests_per_client: int | None = None
    input_len: int = DEFAULT_INPUT_LEN  # mean prompt tokens (exact for `synthetic`)
    output_len: int = DEFAULT_OUTPUT_LEN  # mean output tokens (exact for `synthetic`)
    api_key: str | None = field(default=None, repr=False)
    rate_per_s: float | None = None  # open loop: arrivals per second; None: closed loop
    poisson: bool = False  # random (gamma) gaps between arrivals instead of evenly spaced ones
    burstiness: float = 1.0  # with poisson, the gamma shape as vLLM's: 1 is Poisson, < 1 burstier
    workload: str = "synthetic"  # a preset of backends.workloads
    seed: int = 0  # of the arrival gaps and the workload's lengths and prompts
    # Sampling temperature; None leaves it to the server (the model's generation config).
    # Acceptance depends on it: at 0 a drafter only has to match the target's argmax.
    temperature: float | None = None

    def at_level(self, c: int) -> BenchConfig:
        """The sweep as the level of `c` clients runs it."""
        if self.requests_per_client is None or self.requests_per_level is None:
            return self
        count = max(self.requests_per_level, self.requests_per_client * c)
        return dataclasses.replace(self, requests_per_level=count)

    def bench_workload(self) -> BenchWorkload:
        """The workload: each request of a level by its index."""
        return BenchWorkload(self.workload, self.input_len, self.output_len, self.seed)


@dataclass
class RequestResult:
    """One request, as the client saw it."""

    ok: bool
    e2e_s: float = 0.0
    ttft_s: float | None = None
    itls_s: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int = 0
    error: str | None = None
    sent_at: float = 0.0  # time.perf_counter() when the request went out


@dataclass(frozen=True)
class LevelResult:
    """One concurrency level's figures."""

    concurrency: int
    duration_s: float
    completed: int
    failed: int
    output_tokens: int
    input_tokens: int
    output_tokens_per_s: float
    ttft_ms: list[float]
    itl_ms: list[float]  # between streamed chunks, as vLLM's bench names it (one chunk may
    # carry several tokens when drafts are accepted): not the per-token latency
    e2e_ms: list[float]
    acceptance_length: float | None
    acceptance_per_position: list[float] | None
    request_rate_per_s: float | None = None  # the rate asked for; None: closed loop
    # Requests sent / time of the last send; below the rate asked when the cap held them back.
    achieved_request_rate_per_s: float | None = None
    mean_in_flight: float = 0.0  # Σ e2e latency / duration (Little's law)
    # Per request, (e2e - TTFT) / (output tokens - 1): vLLM bench's TPOT, the per-token
    # latency the planner, the selector and `itl_objective_ms` mean.
    tpot_ms: list[float] = field(default_factory=list)

    @property
    def load_concurrency(self) -> float:
        """The concurrency the level measured throughput at: its clients, or, open-loop, the
        requests actually in flight on average (the cap may never be reached)."""
        return self.concurrency if self.request_rate_per_s is None else self.mean_in_flight


async def one_request(client: httpx.AsyncClient, config: BenchConfig, index: int) -> RequestResult:
    """Stream request `index` of the workload and time it."""
    planned = config.bench_workload().request(index)
    body = {
        "model": config.model,
        "messages": list(planned.messages),
        "max_tokens": planned.max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if config.temperature is not None:
        body["temperature"] = config.temperature
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    start = time.perf_counter()
    result, last = RequestResult(ok=False, sent_at=start), start
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
            if r.status_code != 200:
                result.error = f"HTTP {r.status_code}"
                return result
            async for line in r.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                now = time.perf_counter()
                chunk = orjson.loads(line[6:])
                if chunk.get("usage") and not chunk.get("choices"):
                    result.output_tokens = chunk["usage"].get("completion_tokens", 0)
                    result.prompt_tokens = chunk["usage"].get("prompt_tokens", 0)
                    continue
                if result.ttft_s is None:
                    result.ttft_s = now - start
                else:
                    result.itls_s.append(now - last)
                last = now
    except httpx.HTTPError as exc:
        result.error = type(exc).__name__
        return result
    result.ok, result.e2e_s = True, time.perf_counter() - start
    return result


async def scrape(client: httpx.AsyncClient) -> VllmSnapshot | None:
    """The server's vLLM metrics, if it exposes them."""
    try:
        response = await client.get("/metrics", timeout=5.0)
        snapshot = parse_metrics(response.text) if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    return snapshot


def interarrival_gaps_s(
    rate_per_s: float, poisson: bool, burstiness: float, rng: random.Random
) -> Iterator[float]:
    """Endless gaps between arrivals, with mean 1/rate: constant, or gamma-distributed with
    shape `burstiness` as in vLLM (shape 1 is exponential: a Poisson process)."""
    while True:
        if poisson:
            yield rng.gammavariate(burstiness, 1.0 / (rate_per_s * burstiness))
        else:
            yield 1.0 / rate_per_s


def arrival_schedule_s(config: BenchConfig) -> Iterator[float]:
    """When each request of an open-loop level is due, in seconds from the level's start.

    With a request count the times are rescaled, as vLLM does, so the last one falls at
    count/rate (a random sum would miss it by a few percent); with a duration, arrivals come
    until it has passed. The same seed gives the same schedule.
    """
    assert config.rate_per_s is not None, "a schedule needs a request rate"
    rng = random.Random(config.seed)  # noqa: S311  (load shapes, not secrets)
    gaps = interarrival_gaps_s(config.rate_per_s, config.poisson, config.burstiness, rng)
    times = itertools.accumulate(gaps)
    if config.requests_per_level is None:
        duration_s = config.duration_s or 0.0
        return itertools.takewhile(lambda t: t < duration_s, times)
    due = list(itertools.islice(times, config.requests_per_level))
    scale = config.requests_per_level / config.rate_per_s / due[-1]
    return (t * scale for t in due)


async def run_level(
    client: httpx.AsyncClient, config: BenchConfig, c: int, progress: Callable[[int], None]
) -> LevelResult:
    """One level, closed- or open-loop, until its request count or duration is reached."""
    before = await scrape(client)
    start = time.perf_counter()
    if config.rate_per_s is None:
        results = await _closed_loop(client, config, c, progress)
    else:
        results = await _open_loop(client, config, c, progress)
    elapsed = time.perf_counter() - start
    level = _summarise(c, elapsed, results, before, await scrape(client))
    if config.rate_per_s is None:
        return level
    last_sent = max((r.sent_at - start for r in results), default=0.0)
    achieved = len(results) / last_sent if last_sent > 0 else None
    return dataclasses.replace(
        level, request_rate_per_s=config.rate_per_s, achieved_request_rate_per_s=achieved
    )


async def _closed_loop(
    client: httpx.AsyncClient, config: BenchConfig, c: int, progress: Callable[[int], None]
) -> list[RequestResult]:
    """`c` clients, each sending its next request as soon as its last one ends."""
    results: list[RequestResult] = []
    deadline = time.monotonic() + (config.duration_s or 0)
    issued = 0

    def more() -> bool:
        if config.requests_per_level is not None:
            return issued < config.requests_per_level
        return time.monotonic() < deadline

    async def client_loop() -> None:
        nonlocal issued
        while more():
            index, issued = issued, issued + 1
            results.append(await one_request(client, config, index))
            progress(1)

    await asyncio.gather(*(client_loop() for _ in range(c)))
    return results


async def _open_loop(
    client: httpx.AsyncClient, config: BenchConfig, c: int, progress: Callable[[int], None]
) -> list[RequestResult]:
    """Requests arrive on the schedule; at most `c` are in flight, the rest wait their turn
    (like `vllm bench serve --max-concurrency`). Arrivals stop at the level's duration; those
    already waiting still go out."""
    results: list[RequestResult] = []
    in_flight = asyncio.Semaphore(c)

    async def send(index: int) -> None:
        async with in_flight:
            results.append(await one_request(client, config, index))
        progress(1)

    start = time.perf_counter()
    async with asyncio.TaskGroup() as group:  # cancelling the level cancels every request
        for index, due_s in enumerate(arrival_schedule_s(config)):
            await asyncio.sleep(max(0.0, start + due_s - time.perf_counter()))
            group.create_task(send(index))
    return results


def _summarise(
    c: int,
    elapsed: float,
    results: list[RequestResult],
    before: VllmSnapshot | None,
    after: VllmSnapshot | None,
) -> LevelResult:
    ok = [r for r in results if r.ok]
    acceptance, per_position = None, None
    change = difference(before, after, elapsed) if before and after else None
    if change is not None and change.drafts > 0:
        acceptance = 1 + change.accepted / change.drafts
        per_position = [a / change.drafts for a in change.accepted_per_position]
    output = sum(r.output_tokens for r in ok)
    return LevelResult(
        concurrency=c,
        duration_s=elapsed,
        completed=len(ok),
        failed=len(results) - len(ok),
        output_tokens=output,
        input_tokens=sum(r.prompt_tokens for r in ok),
        output_tokens_per_s=output / elapsed if elapsed else 0.0,
        ttft_ms=[r.ttft_s * 1000 for r in ok if r.ttft_s is not None],
        itl_ms=[x * 1000 for r in ok for x in r.itls_s],
        e2e_ms=[r.e2e_s * 1000 for r in ok],
        tpot_ms=[
            (r.e2e_s - r.ttft_s) * 1000 / (r.output_tokens - 1)
            for r in ok
            if r.ttft_s is not None and r.output_tokens > 1
        ],
        acceptance_length=acceptance,
        acceptance_per_position=per_position,
        mean_in_flight=sum(r.e2e_s for r in ok) / elapsed if elapsed else 0.0,
    )


def _stats(values: list[float], name: str) -> dict[str, float | None]:
    if not values:
        return {f"mean_{name}_ms": None, f"median_{name}_ms": None, f"p99_{name}_ms": None}
    ordered = sorted(values)
    return {
        f"mean_{name}_ms": statistics.fmean(values),
        f"median_{name}_ms": statistics.median(values),
        f"std_{name}_ms": statistics.pstdev(values),
        f"p99_{name}_ms": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
    }


def vllm_bench_json(config: BenchConfig, level: LevelResult) -> dict[str, Any]:
    """One level in `vllm bench serve --save-result`'s format."""
    body: dict[str, Any] = {
        "date": time.strftime("%Y%m%d-%H%M%S"),
        "backend": "openai-chat",
        "model_id": config.model,
        "num_prompts": level.completed + level.failed,
        "request_rate": "inf" if config.rate_per_s is None else config.rate_per_s,
        "burstiness": _burstiness(config),
        "max_concurrency": level.concurrency,
        "duration": level.duration_s,
        "completed": level.completed,
        "failed": level.failed,
        "total_input_tokens": level.input_tokens,
        "total_output_tokens": level.output_tokens,
        "request_throughput": level.completed / level.duration_s if level.duration_s else 0.0,
        "output_throughput": level.output_tokens_per_s,
        "total_token_throughput": (level.input_tokens + level.output_tokens) / level.duration_s
        if level.duration_s
        else 0.0,
    }
    figures = (
        ("ttft", level.ttft_ms),
        ("tpot", level.tpot_ms),
        ("itl", level.itl_ms),
        ("e2el", level.e2e_ms),
    )
    for name, values in figures:
        body |= _stats(values, name)
    if level.acceptance_length is not None:
        body["spec_decode_acceptance_length"] = level.acceptance_length
        body["spec_decode_per_position_acceptance_rates"] = level.acceptance_per_position
    if level.achieved_request_rate_per_s is not None:  # draftgate's own, as --metadata would be
        body["achieved_request_rate"] = level.achieved_request_rate_per_s
    return body


def _burstiness(config: BenchConfig) -> float | str:
    """vLLM's burstiness: evenly spaced arrivals are its `inf` (constant gaps); a closed loop
    has none, and vLLM writes its default, 1.0."""
    if config.rate_per_s is not None and not config.poisson:
        return "inf"
    return config.burstiness


class Progress:
    """Reports `[c=N] done/total` about ten times per level."""

    def __init__(self, c: int, total: int | None, report: Callable[[str], None]) -> None:
        self.c, self.total, self.report, self.done = c, total, report, 0

    def __call__(self, n: int) -> None:
        self.done += n
        step = max(1, (self.total or 10) // 10)
        if self.done == self.total or self.done % step == 0:
            self.report(f"[c={self.c}] {self.done}/{self.total or '...'} requests")


async def run_sweep(config: BenchConfig, report: Callable[[str], None]) -> list[LevelResult]:
    """Every level in turn, reporting progress."""
    limits = httpx.Limits(max_connections=max(config.concurrency) + 4)
    timeout = httpx.Timeout(300.0, connect=10.0)
    results = []
    async with httpx.AsyncClient(base_url=config.url, limits=limits, timeout=timeout) as client:
        for c in config.concurrency:
            level = config.at_level(c)
            progress = Progress(c, level.requests_per_level, report)
            results.append(await run_level(client, level, c, progress))
    return results
