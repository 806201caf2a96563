"""Drives the engine core in real time (scaled) and hands each request its tokens."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from backends.sim.engine import EngineCore, SimRequest, StepResult
from backends.sim.metrics import SimMetrics
from backends.sim.statlog import StatTally
from backends.sim.text import PseudoText

# If the event loop falls this far behind the model's schedule, restart the schedule from
# now instead of running steps back to back to catch up.
MAX_LAG_S = 0.25


@dataclass
class Stream:
    """Where one request's output goes: (text, tokens) events, then (None, finish reason)."""

    request: SimRequest
    text: PseudoText
    sent_tokens: int = 0
    events: asyncio.Queue[tuple[str | None, Any]] = field(default_factory=asyncio.Queue)


async def merged(streams: Sequence[Stream]) -> AsyncIterator[tuple[int, str | None, Any]]:
    """Several streams' events as they come, each with its stream's index: (index, text,
    tokens), then (index, None, finish reason) as each ends; an abort (its client left) is
    the last event."""
    events: asyncio.Queue[tuple[int, str | None, Any]] = asyncio.Queue()

    async def pump(index: int, stream: Stream) -> None:
        while True:
            text, value = await stream.events.get()
            events.put_nowait((index, text, value))
            if text is None:
                return
            # let the other pumps take their turn: a stream whose events piled up while the
            # client read slowly must not pass all of them ahead of the others' of each step
            await asyncio.sleep(0)

    pumps = [asyncio.create_task(pump(i, stream)) for i, stream in enumerate(streams)]
    try:
        ended = 0
        while ended < len(streams):
            index, text, value = await events.get()
            yield index, text, value
            if text is None and value == "abort":
                return
            ended += text is None
    finally:
        for task in pumps:
            task.cancel()


class EngineRunner:
    """Runs engine steps on the event loop; durations are simulated seconds / time scale."""

    def __init__(self, core: EngineCore, metrics: SimMetrics, time_scale: float) -> None:
        self.core = core
        self.metrics = metrics
        self.time_scale = time_scale
        self._streams: dict[SimRequest, Stream] = {}
        self._wake = asyncio.Event()
        self._origin = 0.0
        self.tally = StatTally()  # for the log's stats lines (backends/sim/statlog.py)

    def take_tally(self) -> StatTally:
        """What the engine did since the last call, for the log."""
        tally, self.tally = self.tally, StatTally()
        return tally

    def state(self) -> tuple[int, int, float]:
        """Running and waiting requests, and the KV cache's use (0-1)."""
        return len(self.core.running), len(self.core.waiting), self.core.kv_usage()

    def now_s(self) -> float:
        """Simulated seconds since the runner started."""
        return (asyncio.get_running_loop().time() - self._origin) * self.time_scale

    def wall_s(self, simulated_s: float) -> float:
        """Simulated seconds as the wall clock sees them: what the latency metrics report, so
        a scraper's rates (counters over wall time) agree with the latencies it reads."""
        return simulated_s / self.time_scale

    def submit(self, request: SimRequest, text: PseudoText) -> Stream:
        """Queue a request; its output arrives on the returned stream."""
        stream = Stream(request, text)
        self._streams[request] = stream
        self.core.add(request)
        self.metrics.waiting.set(len(self.core.waiting))
        self._wake.set()
        return stream

    def abort(self, request: SimRequest) -> None:
        """Stop generating for a request whose client is gone."""
        if self._streams.pop(request, None) is not None:
            self.core.abort(request)
            self.metrics.success("abort")

    async def run(self) -> None:
        """The engine loop; runs until cancelled."""
        loop = asyncio.get_running_loop()
        self._origin = loop.time()
        deadline: float | None = None
        while True:
            if self.core.idle:
                self._gauges()
                await self._wake.wait()
                deadline = None
            self._wake.clear()
            now = self.now_s()
            start = now if deadline is None or deadline < now - MAX_LAG_S else deadline
            result = self.core.step(start)
            self._gauges()
            deadline = start + result.duration_s
            delay = (deadline - self.now_s()) / self.time_scale
            if delay > 0:
                await asyncio.sleep(delay)
            self._deliver(result, deadline)

    def _gauges(self) -> None:
        self.metrics.running.set(len(self.core.running))
        self.metrics.waiting.set(len(self.core.waiting))
        self.metrics.kv_usage.set(self.core.kv_usage())

    def _deliver(self, result: StepResult, end_s: float) -> None:
        m = self.metrics
        new_tokens = 0
        for request, tokens in result.outputs:
            stream = self._streams.get(request)
            if stream is None or not tokens:
                continue
            new_tokens += tokens
            if stream.sent_tokens:
                m.itl.observe(self.wall_s(result.duration_s))
            else:
                m.ttft.observe(self.wall_s(end_s - request.arrived_s))
            stream.sent_tokens += tokens
            stream.events.put_nowait((stream.text.take(tokens), tokens))
        for request in result.finished:
            stream = self._streams.pop(request, None)
            if stream is not None:
                self._record_finished(request)
                stream.events.put_nowait((None, request.finish_reason))
        m.generation_tokens.inc(new_tokens)
        m.prompt_tokens.inc(result.prompt_tokens_done)
        self.tally.add_step(result.prompt_tokens_done, new_tokens)
        if result.drafts:
            self.tally.add_drafts(result.drafts, result.draft_tokens, result.accepted_per_pos)
        m.iteration_tokens.observe(new_tokens + result.prompt_tokens_done)
        if result.preempted:
            m.preemptions.inc(result.preempted)
        if m.prefix is not None:
            m.prefix.record(
                result.cache_queries,
                result.cache_hits,
                result.computed_prompt_tokens,
                result.cached_prompt_tokens,
            )
        if m.spec is not None:
            m.spec.record(result.drafts, result.draft_tokens, result.accepted_per_pos)

    def _record_finished(self, request: SimRequest) -> None:
        m, end = self.metrics, request.last_token_s or self.now_s()
        m.success(request.finish_reason or "stop")
        m.e2e.observe(self.wall_s(end - request.arrived_s))
        m.queue_time.observe(
            self.wall_s((request.scheduled_s or request.arrived_s) - request.arrived_s)
        )
        m.prompt_hist.observe(request.prompt_tokens)
        m.generation_hist.observe(request.generated)
        if request.generated > 1 and request.first_token_s is not None:
            m.tpot.observe(self.wall_s(end - request.first_token_s) / (request.generated - 1))
