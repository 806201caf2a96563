"""The simulated engine: continuous batching with speculative decoding, one step at a time.

`EngineCore.step(now_s)` schedules one engine step the way vLLM's scheduler does (admit
waiting requests within the sequence and KV-cache budgets, chunked prefill beside the
decodes), draws each decoding sequence's accepted draft tokens from its acceptance profile,
and returns how long the step takes according to the performance model. It is synchronous
and clock-free: the server drives it in real time, the calibration report in virtual time.
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass, field

from backends.sim.prefix_cache import PrefixCache
from planner.acceptance import AcceptanceProfile
from planner.specdec import StepShape, StepTimeModel

FinishReason = str  # "stop" | "length" | "abort"


@dataclass
class SpecStats:
    """One request's speculative-decoding tally (vLLM's per-request spec metrics)."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    histogram: list[int] = field(default_factory=list)  # steps by number of accepted drafts


@dataclass(eq=False)
class SimRequest:
    """A request inside the engine."""

    request_id: str
    prompt_tokens: int
    max_tokens: int
    stop_at: int  # where the text ends naturally (max_tokens when EOS is ignored)
    acceptance: AcceptanceProfile | None
    arrived_s: float
    prefill_needed: int = 0  # the prompt; prompt + output after a preemption (recompute)
    prefilled: int = 0
    generated: int = 0
    scheduled_s: float | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None
    finish_reason: FinishReason | None = None
    priority: int = 0  # lower first, under the priority scheduling policy
    spec: SpecStats = field(default_factory=SpecStats)
    block_hashes: tuple[bytes, ...] = ()  # the prompt's full blocks, for the prefix cache
    cached_tokens: int = 0  # prompt tokens found in the prefix cache at its last admission
    # ... at its first admission: what vLLM's usage says (its `num_cached_tokens` is set when
    # a request is first scheduled, and kept through preemptions)
    first_cached_tokens: int = 0

    def __post_init__(self) -> None:
        self.prefill_needed = self.prefill_needed or self.prompt_tokens

    @property
    def context_tokens(self) -> int:
        """Tokens in the KV cache."""
        return self.prompt_tokens + self.generated if self.decoding else self.prefilled

    @property
    def decoding(self) -> bool:
        """Prefill is done; each step now adds tokens."""
        return self.prefilled >= self.prefill_needed


@dataclass(frozen=True)
class EngineLimits:
    """vLLM's scheduler limits."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    kv_cache_bytes: float = 64e9
    max_model_len: int = 32768
    by_priority: bool = False  # vLLM's --scheduling-policy priority: waiting by priority


@dataclass
class StepResult:
    """What one step produced: its duration and each sequence's new tokens."""

    duration_s: float
    outputs: list[tuple[SimRequest, int]]  # (request, new tokens), in batch order
    finished: list[SimRequest]
    preempted: int
    prompt_tokens_done: int
    cache_queries: int = 0  # tokens looked up in the prefix cache at admission
    cache_hits: int = 0  # of which found cached
    computed_prompt_tokens: int = 0  # prompt tokens of first admissions that were computed
    cached_prompt_tokens: int = 0  # and that were found cached
    drafts: int = 0
    draft_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)


class EngineCore:
    """Scheduling and token accounting of one simulated vLLM engine."""

    def __init__(
        self,
        step_model: StepTimeModel,
        limits: EngineLimits,
        *,
        adaptive_verification: bool = False,
        prefix_cache: PrefixCache | None = None,
        seed: int = 0,
    ) -> None:
        self.step_model = step_model
        self.limits = limits
        self.prefix_cache = prefix_cache
        self.k = step_model.k
        self.adaptive_verification = adaptive_verification
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self._rng = random.Random(seed)

    def add(self, request: SimRequest) -> None:
        """Queue a request: last, or by priority then arrival under the priority policy."""
        if self.limits.by_priority:
            place = (request.priority, request.arrived_s)
            at = next(
                (i for i, w in enumerate(self.waiting) if (w.priority, w.arrived_s) > place),
                len(self.waiting),
            )
            self.waiting.insert(at, request)
            return
        self.waiting.append(request)

    def abort(self, request: SimRequest) -> None:
        """Drop a request whose client went away."""
        request.finish_reason = "abort"
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)

    @property
    def idle(self) -> bool:
        return not self.running and not self.waiting

    def kv_usage(self) -> float:
        """Fraction of the KV cache in use."""
        model = self.step_model.model
        used = sum(model.kv_bytes_for_context(r.context_tokens) for r in self.running)
        return min(1.0, used / self.limits.kv_cache_bytes)

    def step(self, now_s: float) -> StepResult:
        """Plan and account one engine step starting at `now_s` (simulated seconds)."""
        result = StepResult(0.0, [], [], self._make_room(), 0, accepted_per_pos=[0] * self.k)
        self._admit(now_s, result)
        decoding = [r for r in self.running if r.decoding]
        prefill = self._prefill_chunks(budget=self.limits.max_num_batched_tokens)
        verify_lengths = self._verify_lengths(decoding)
        for request, length in zip(decoding, verify_lengths, strict=True):
            result.outputs.append((request, self._advance(request, length, result)))
        for request, chunk in prefill:
            request.prefilled += chunk
            if request.decoding:
                if request.first_token_s is None:
                    result.prompt_tokens_done += request.prompt_tokens
                if self.prefix_cache is not None:
                    self.prefix_cache.insert(request.block_hashes, self._private_blocks())
                result.outputs.append((request, self._advance(request, 0, result)))
        result.duration_s = self.step_model.step_s(
            StepShape(
                decode_seqs=len(decoding),
                verify_tokens=sum(1 + n for n in verify_lengths),
                drafted_tokens=self.k * len(decoding),
                prefill_tokens=sum(chunk for _, chunk in prefill),
                context_tokens=sum(r.context_tokens for r in decoding),
            )
        )
        self._finish(result, now_s + result.duration_s)
        return result

    def _admit(self, now_s: float, result: StepResult) -> None:
        """Move waiting requests into the batch while sequences and KV cache allow."""
        model, limits = self.step_model.model, self.limits
        used = sum(model.kv_bytes_for_context(r.context_tokens) for r in self.running)
        while self.waiting and len(self.running) < limits.max_num_seqs:
            request = self.waiting[0]
            need = model.kv_bytes_for_context(request.prefill_needed + 1)
            if self.running and used + need > limits.kv_cache_bytes:
                break
            self.waiting.popleft()
            self._skip_cached_prefill(request, result)
            request.scheduled_s = request.scheduled_s if request.scheduled_s else now_s
            used += need
            self.running.append(request)

    def _skip_cached_prefill(self, request: SimRequest, result: StepResult) -> None:
        """Start the prefill after the prompt's cached blocks, counting the lookup as vLLM
        does: queried tokens are the tokens to prefill, hits those found."""
        if self.prefix_cache is None:
            return
        cached = self.prefix_cache.cached_tokens(request.block_hashes, request.prompt_tokens)
        request.prefilled, request.cached_tokens = cached, cached
        result.cache_queries += request.prefill_needed
        result.cache_hits += cached
        if request.scheduled_s is None:  # the first admission: where its prompt came from
            result.computed_prompt_tokens += request.prompt_tokens - cached
            result.cached_prompt_tokens += cached
            request.first_cached_tokens = cached

    def _private_blocks(self) -> int:
        """KV blocks running requests hold beyond their cached prompt blocks."""
        cache = self.prefix_cache
        assert cache is not None
        size = cache.block_size
        held = 0
        for r in self.running:
            shared = len(r.block_hashes) if r.decoding else r.cached_tokens // size
            held += max(-(-r.context_tokens // size) - shared, 0)
        return held

    def _make_room(self) -> int:
        """Preempt the newest requests (recompute) while the KV cache is over capacity."""
        preempted = 0
        while len(self.running) > 1 and self.kv_usage() >= 1.0:
            victim = self.running.pop()
            victim.prefill_needed = victim.prompt_tokens + victim.generated  # recompute
            victim.prefilled = 0
            self.waiting.appendleft(victim)
            preempted += 1
        return preempted

    def _prefill_chunks(self, budget: int) -> list[tuple[SimRequest, int]]:
        """Chunked prefill: prompt tokens of admitted requests, oldest first, within budget."""
        budget -= sum(1 + self.k for r in self.running if r.decoding)
        chunks = []
        for request in self.running:
            if budget <= 0:
                break
            if not request.decoding:
                chunk = min(budget, request.prefill_needed - request.prefilled)
                chunks.append((request, chunk))
                budget -= chunk
        return chunks

    def _verify_lengths(self, decoding: list[SimRequest]) -> list[int]:
        """Draft positions to verify per sequence: K, or fewer with adaptive verification."""
        if not self.k:
            return [0] * len(decoding)
        if not self.adaptive_verification or not decoding:
            return [self.k] * len(decoding)
        threshold = self._survival_threshold(decoding)
        lengths = []
        for request in decoding:
            survival = request.acceptance.survival(self.k) if request.acceptance else ()
            lengths.append(max(1, sum(1 for s in survival if s >= threshold)))
        return lengths

    def _survival_threshold(self, decoding: list[SimRequest]) -> float:
        """Verify a position only if its survival pays for the extra verify cost (DSpark).

        One more verified token per sequence costs `marginal_s`; a position that survives
        with probability S saves S tokens' worth of step time.
        """
        n, k = len(decoding), self.k
        context = sum(r.context_tokens for r in decoding)
        full = StepShape(n, n * (1 + k), n * k, 0, context)
        more = StepShape(n, full.verify_tokens + n, full.drafted_tokens, 0, context)
        model = self.step_model
        marginal_s = (model.target_s(more) - model.target_s(full)) / n
        tokens = sum(
            r.acceptance.mean_acceptance_length(k) if r.acceptance else 1.0 for r in decoding
        )
        return marginal_s / (model.step_s(full) / tokens)

    def _advance(self, request: SimRequest, verify: int, result: StepResult) -> int:
        """Draw accepted drafts for one sequence and return the tokens it gains this step."""
        accepted = self._draw_accepted(request, verify) if verify else 0
        if verify:
            result.drafts += 1
            result.draft_tokens += verify
            for position in range(accepted):
                result.accepted_per_pos[position] += 1
            spec = request.spec
            spec.drafts, spec.draft_tokens = spec.drafts + 1, spec.draft_tokens + verify
            spec.accepted_tokens += accepted
            if len(spec.histogram) <= self.k:
                spec.histogram.extend([0] * (self.k + 1 - len(spec.histogram)))
            spec.histogram[accepted] += 1
        new = min(1 + accepted, request.stop_at - request.generated)
        request.generated += new
        return new

    def _draw_accepted(self, request: SimRequest, verify: int) -> int:
        if request.acceptance is None:
            return 0
        accepted, draw = 0, self._rng.random
        for p in request.acceptance.conditional[:verify]:
            if draw() >= p:
                break
            accepted += 1
        return accepted

    def _finish(self, result: StepResult, end_s: float) -> None:
        for request, new in result.outputs:
            if new and request.first_token_s is None:
                request.first_token_s = end_s
            if new:
                request.last_token_s = end_s
            if request.generated >= request.stop_at:
                request.finish_reason = (
                    "length" if request.stop_at >= request.max_tokens else "stop"
                )
                result.finished.append(request)
        if result.finished:
            done = set(map(id, result.finished))
            self.running = [r for r in self.running if id(r) not in done]


def natural_length(rng: random.Random, mean_tokens: int) -> int:
    """Where a response ends on its own: log-normal around the workload's mean length."""
    sigma = 0.6
    return max(1, round(rng.lognormvariate(math.log(mean_tokens) - sigma * sigma / 2, sigma)))
