"""GPU memory: how many sequences fit in the KV cache beside the target and its drafter.

vLLM gives the KV cache what is left of `gpu_memory_utilization` (0.9) of each GPU's memory
after the weights and its profiled activations. A drafter takes from it twice: its weights,
and a KV cache of its own layers for every sequence (EAGLE-3 one layer, DFlash and DSpark
five, P-EAGLE four). Past the concurrency that fills it, vLLM preempts sequences and the
rest wait: throughput stops growing and a client's time per token grows with the queue.
"""

from __future__ import annotations

from planner.calibration import Workload
from planner.specdec import BYTES_PER_DRAFTER_PARAM, StepTimeModel, mean_context_tokens

GPU_MEMORY_UTILIZATION = 0.9  # vLLM's --gpu-memory-utilization default
# Activations of a max-size batch, CUDA graphs and communication buffers: vLLM's start-up
# profile typically reports 1-4 GiB per GPU for these models; an estimate.
RUNTIME_RESERVE_BYTES_PER_GPU = 3e9


def kv_capacity_bytes(step: StepTimeModel) -> float:
    """KV-cache bytes across the model's GPUs once weights and runtime are placed."""
    usable = step.gpu.memory_bytes * GPU_MEMORY_UTILIZATION - RUNTIME_RESERVE_BYTES_PER_GPU
    drafter = step.drafter_params() * BYTES_PER_DRAFTER_PARAM
    return usable * step.gpu_count - step.model.weight_bytes() - drafter


def kv_bytes_per_sequence(step: StepTimeModel, workload: Workload) -> float:
    """A sequence's KV cache, target and drafter, at its mean length (prompt plus half the
    answer, as the steady state holds them) and its K speculative slots."""
    tokens = mean_context_tokens(workload) + step.k
    m = step.model
    drafter_layers = step.drafter.layers if step.drafter is not None and step.k else 0
    return (
        m.kv_bytes_for_context(tokens) + drafter_layers * m.full_layer_kv_bytes_per_token() * tokens
    )


def max_concurrency(step: StepTimeModel, workload: Workload) -> int:
    """Sequences that fit at once (0: the weights leave no room for one)."""
    return max(int(kv_capacity_bytes(step) // kv_bytes_per_sequence(step, workload)), 0)
