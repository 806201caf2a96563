"""The benchmark runner: a closed-loop load sweep against an OpenAI-compatible server.

At each concurrency, that many clients each stream chat completions back to back (fixed
prompt and output lengths, `ignore_eos`) for a number of requests or seconds, timing the
first token, every chunk and the whole request on the client side. When the URL is a vLLM
server, its `/metrics` before and after each level give the acceptance as vLLM defines it.
Results print as a table and can be saved in `vllm bench serve`'s JSON format.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from backends.vllm_metrics import VllmSnapshot, difference, parse_metrics

WORDS = "the model drafts tokens and the target verifies them in one step".split()


@dataclass(frozen=True)
class BenchConfig:
    """One sweep."""

    url: str  # base URL without /v1
    model: str
    concurrency: tuple[int, ...]
    requests_per_level: int | None = None
    duration_s: float | None = None
    input_len: int = 128
    output_len: int = 128
    api_key: str | None = None


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
    itl_ms: list[float]
    e2e_ms: list[float]
    acceptance_length: float | None
    acceptance_per_position: list[float] | None


def _prompt(input_len: int, salt: int) -> str:
    return " ".join(WORDS[(i + salt) % len(WORDS)] for i in range(input_len))


async def one_request(client: httpx.AsyncClient, config: BenchConfig, salt: int) -> RequestResult:
    """Stream one chat completion and time it."""
    body = {
        "model": config.model,
        "messages": [{"role": "user", "content": _prompt(config.input_len, salt)}],
        "max_tokens": config.output_len,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    result, start = RequestResult(ok=False), time.perf_counter()
    last = start
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


async def run_level(
    client: httpx.AsyncClient, config: BenchConfig, c: int, progress: Callable[[int], None]
) -> LevelResult:
    """`c` closed-loop clients until the level's request count or duration is reached."""
    before = await scrape(client)
    results: list[RequestResult] = []
    budget = config.requests_per_level or 0
    deadline = time.monotonic() + (config.duration_s or 0)
    issued = 0

    def more() -> bool:
        if config.requests_per_level is not None:
            return issued < budget
        return time.monotonic() < deadline

    async def worker(n: int) -> None:
        nonlocal issued
        while more():
            issued += 1
            results.append(await one_request(client, config, issued + n))
            progress(1)

    start = time.perf_counter()
    await asyncio.gather(*(worker(n) for n in range(c)))
    elapsed = time.perf_counter() - start
    return _summarise(c, elapsed, results, before, await scrape(client))


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
        acceptance_length=acceptance,
        acceptance_per_position=per_position,
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
        "request_rate": "inf",
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
    for name, values in (("ttft", level.ttft_ms), ("itl", level.itl_ms), ("e2el", level.e2e_ms)):
        body |= _stats(values, name)
    if level.acceptance_length is not None:
        body["spec_decode_acceptance_length"] = level.acceptance_length
        body["spec_decode_per_position_acceptance_rates"] = level.acceptance_per_position
    return body


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
            progress = Progress(c, config.requests_per_level, report)
            results.append(await run_level(client, config, c, progress))
    return results
