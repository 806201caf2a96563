"""Performance model of speculative decoding: engine step time and steady-state throughput.

A step of the target verifies 1 + K tokens for each decoding sequence (plus any prefill
tokens). Its time is a fixed host overhead, per-sequence and per-token overheads, and the
larger of streaming weights and KV cache from HBM and the matmul FLOPs (a roofline). The
drafter adds K sequential passes (EAGLE-3, MTP, draft models) or one pass that drafts all K
positions (P-EAGLE, DFlash, DSpark). Acceptance comes from the model, drafter and traffic;
the hardware only changes step times, so a what-if on another GPU keeps the acceptance.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from planner.calibration import DrafterShape, EngineCalibration, Workload
from planner.catalog import GpuSpec, ModelSpec

BYTES_PER_DRAFTER_PARAM = 2.0  # drafters are served in bf16
PARAMS_PER_LAYER_PER_HIDDEN_SQUARED = 12  # attention 4h^2 + MLP 8h^2


@dataclass(frozen=True, slots=True)
class StepShape:
    """What one engine step computes."""

    decode_seqs: int
    verify_tokens: int  # tokens the target scores for decoding sequences: 1 + drafts each
    drafted_tokens: int  # draft positions proposed across the batch
    prefill_tokens: int
    context_tokens: int  # tokens of KV cache the decoding sequences attend over, summed


@dataclass(frozen=True)
class StepTimeModel:
    """Step time of one vLLM engine serving `model` on `gpu_count` GPUs with a drafter."""

    model: ModelSpec
    gpu: GpuSpec
    gpu_count: int
    calibration: EngineCalibration
    drafter: DrafterShape | None = None
    k: int = 0

    @cached_property
    def _hbm_bytes_per_s(self) -> float:
        return self.gpu.hbm_bytes_per_s * self.gpu_count * self.calibration.bandwidth_efficiency

    @cached_property
    def _flops_per_s(self) -> float:
        return self.gpu.bf16_flops_per_s * self.gpu_count * self.calibration.compute_efficiency

    def step_s(self, shape: StepShape) -> float:
        """Seconds for one engine step: the target's verify/prefill plus the drafter."""
        return self.target_s(shape) + self.drafter_s(shape)

    def target_s(self, shape: StepShape) -> float:
        """Seconds the target model takes for one step."""
        cal = self.calibration
        tokens = shape.verify_tokens + shape.prefill_tokens
        if tokens == 0:
            return 0.0
        memory_s = (
            self._weight_bytes_read(shape) + self._kv_bytes_read(shape)
        ) / self._hbm_bytes_per_s
        compute_s = (tokens * self.model.flops_per_token() + self._attention_flops(shape)) / (
            self._flops_per_s
        )
        overhead_s = (
            cal.step_overhead_s
            + cal.per_seq_overhead_s * shape.decode_seqs
            + cal.per_token_overhead_s * tokens
        )
        gpu_s = max(memory_s, compute_s) + self._moe_s(tokens) + self._collectives_s(tokens)
        hidden = cal.plain_overlap if not self.k else 0.0
        return (1 - hidden) * (overhead_s + gpu_s) + hidden * max(overhead_s, gpu_s)

    def _moe_s(self, tokens: int) -> float:
        """What MoE layers cost beyond the roofline: a fixed part and one per token."""
        if not self.model.is_moe:
            return 0.0
        cal = self.calibration
        return self.model.layers * (cal.moe_per_layer_s + cal.moe_per_token_layer_s * tokens)

    def _collectives_s(self, tokens: int) -> float:
        """Each layer's collectives when the model spans GPUs: a latency, and a part that
        grows with the tokens they move."""
        if self.gpu_count <= 1:
            return 0.0
        cal = self.calibration
        per_layer = cal.collective_per_layer_s + cal.collective_per_token_layer_s * tokens
        return self.model.layers * per_layer

    def prefill_s_per_token(self, prompt_tokens: int) -> float:
        """Engine seconds each prompt token adds to the steps that prefill it: its matmul
        and causal-attention FLOPs at the engine's compute efficiency, plus the per-token
        overhead. The weights are not counted: a chunked prefill rides along decode steps
        that stream them anyway."""
        shape = StepShape(0, 0, 0, prompt_tokens, 0)
        flops = prompt_tokens * self.model.flops_per_token() + self._attention_flops(shape)
        return flops / self._flops_per_s / prompt_tokens + self.calibration.per_token_overhead_s

    def _weight_bytes_read(self, shape: StepShape) -> float:
        """Dense weights always; routed experts as far as the step's tokens touch them."""
        experts = self.model.expert_weight_bytes()
        if not experts:
            return self.model.weight_bytes()
        seqs = max(shape.decode_seqs, 1)
        per_seq = shape.verify_tokens / seqs
        # Tokens of one sequence route alike: T of them touch experts like T**gamma would.
        routed = seqs * per_seq**self.calibration.routing_correlation + shape.prefill_tokens
        dense = self.model.weight_bytes() - experts
        return dense + experts * self.model.expert_fraction_read(routed)

    def _kv_bytes_read(self, shape: StepShape) -> float:
        """Each sequence's KV cache and recurrent state read; the recurrent state written
        back once per verified position (a speculative step keeps one per position to roll
        back to the last accepted token: K + 1 writes, 1 without speculation)."""
        if not shape.decode_seqs:
            return 0.0
        mean_context = shape.context_tokens // shape.decode_seqs
        writes = shape.verify_tokens * self.model.recurrent_bytes()
        kv = self._kv_by_context.get(mean_context)
        if kv is None:  # a step and the same step with a prefill read the same contexts
            kv = self._kv_by_context[mean_context] = self.model.kv_bytes_for_context(mean_context)
        return shape.decode_seqs * kv + writes

    @cached_property
    def _kv_by_context(self) -> dict[int, float]:
        """One sequence's KV bytes by context length, as computed so far."""
        return {}

    def _attention_flops(self, shape: StepShape) -> float:
        """QK^T and AV over the context for decode tokens; causal self-attention for prefill."""
        m = self.model
        per_token_context = 4 * m.full_attention_layers * m.num_attention_heads * m.head_dim
        mean_context = shape.context_tokens / max(shape.decode_seqs, 1)
        decode = shape.verify_tokens * per_token_context * mean_context
        prefill = shape.prefill_tokens * per_token_context * shape.prefill_tokens / 2
        return decode + prefill

    def drafter_s(self, shape: StepShape) -> float:
        """Seconds the drafter takes: one pass (parallel) or K passes (autoregressive)."""
        d, cal = self.drafter, self.calibration
        if d is None or not self.k or not shape.decode_seqs:
            return 0.0
        passes = 1 if d.parallel else self.k
        tokens_per_pass = shape.drafted_tokens if d.parallel else shape.decode_seqs
        params = self.drafter_params()
        memory_s = params * BYTES_PER_DRAFTER_PARAM / self._hbm_bytes_per_s
        compute_s = 2 * params * tokens_per_pass / self._flops_per_s
        per_pass = (
            cal.drafter_pass_overhead_s
            + cal.drafter_per_seq_overhead_s * shape.decode_seqs
            + cal.drafter_per_token_layer_s * d.layers * tokens_per_pass
            + max(memory_s, compute_s)
        )
        return passes * per_pass

    def drafter_params(self) -> float:
        """The drafter's parameters: its layers at the target's width and its LM head."""
        d = self.drafter
        if d is None or not self.k:
            return 0.0
        h = self.model.hidden_size
        layers = d.layers * PARAMS_PER_LAYER_PER_HIDDEN_SQUARED * h * h
        return float(layers + (d.draft_vocab_size or self.model.vocab_size) * h)


def mean_context_tokens(workload: Workload) -> int:
    """Tokens a decoding sequence holds on average in the steady state: its prompt and half
    its answer."""
    return workload.prompt_tokens + workload.output_tokens // 2


def steady_state_shape(concurrency: int, k: int, workload: Workload) -> StepShape:
    """The average decode step of a closed loop of `concurrency` clients sending `workload`."""
    context = mean_context_tokens(workload)
    return StepShape(
        decode_seqs=concurrency,
        verify_tokens=concurrency * (1 + k),
        drafted_tokens=concurrency * k,
        prefill_tokens=0,
        context_tokens=concurrency * context,
    )


def mean_step_s(
    model: StepTimeModel, concurrency: int, acceptance_length: float, workload: Workload
) -> float:
    """Average step time: decode steps, plus a prompt's prefill each time a request ends."""
    decode = steady_state_shape(concurrency, model.k, workload)
    with_prefill = StepShape(
        decode.decode_seqs,
        decode.verify_tokens,
        decode.drafted_tokens,
        workload.prompt_tokens,
        decode.context_tokens,
    )
    prefills_per_step = concurrency * acceptance_length / workload.output_tokens
    decode_s = model.step_s(decode)
    return decode_s + prefills_per_step * (model.step_s(with_prefill) - decode_s)


def output_tokens_per_s(
    model: StepTimeModel, concurrency: int, acceptance_length: float, workload: Workload
) -> float:
    """Aggregate output tokens/s of `concurrency` steady clients."""
    return (
        concurrency
        * acceptance_length
        / mean_step_s(model, concurrency, acceptance_length, workload)
    )
