"""Hardware catalog: GPU specs, verifier-model shapes and default GPU prices (data files)."""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from types import MappingProxyType
from typing import Protocol, TypeVar

from planner.datafile import (
    PRICE_KINDS,
    WEIGHT_DTYPES,
    CatalogError,
    Fraction,
    PriceKind,
    WeightDtype,
    load_entries,
)

__all__ = ["PRICE_KINDS", "WEIGHT_DTYPES", "CatalogError", "PriceKind", "WeightDtype"]


class UnknownCatalogEntry(KeyError):
    """No GPU, model or price by that name; the message lists the known ones."""

    def __str__(self) -> str:
        # KeyError would repr() the message, quoting it.
        return str(self.args[0])


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One GPU type: memory, bandwidth and dense tensor-core peaks (vendor datasheet)."""

    name: str
    aliases: tuple[str, ...]
    memory_gb: float
    hbm_bandwidth_tb_s: float
    bf16_dense_tflops: float
    fp8_dense_tflops: float | None
    fp4_dense_tflops: float | None
    nvlink_gb_s: float | None
    tdp_w: float
    source: str
    notes: str = ""
    estimated: bool = False

    @property
    def memory_bytes(self) -> float:
        """Device memory in bytes (vendor GB taken as 1e9, a slightly low, safe figure)."""
        return self.memory_gb * 1e9

    @property
    def hbm_bytes_per_s(self) -> float:
        """Peak memory bandwidth in bytes per second."""
        return self.hbm_bandwidth_tb_s * 1e12

    @property
    def bf16_flops_per_s(self) -> float:
        """Dense BF16 tensor-core peak in FLOP/s."""
        return self.bf16_dense_tflops * 1e12

    @property
    def fp8_flops_per_s(self) -> float | None:
        """Dense FP8 tensor-core peak in FLOP/s, None where unsupported."""
        return None if self.fp8_dense_tflops is None else self.fp8_dense_tflops * 1e12

    @property
    def fp4_flops_per_s(self) -> float | None:
        """Dense FP4 tensor-core peak in FLOP/s, None where unsupported."""
        return None if self.fp4_dense_tflops is None else self.fp4_dense_tflops * 1e12

    @property
    def nvlink_bytes_per_s(self) -> float | None:
        """Per-GPU NVLink bandwidth in bytes per second, None without NVLink."""
        return None if self.nvlink_gb_s is None else self.nvlink_gb_s * 1e9


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """One verifier model's shape, as the roofline model needs it (HF config.json)."""

    name: str
    aliases: tuple[str, ...]
    params_b: float
    active_params_b: float
    layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    weight_dtype: WeightDtype
    weight_bytes_per_param: float
    kv_bytes_per_element: float
    sliding_window: int | None
    sliding_window_layer_fraction: Fraction
    max_context: int
    source: str
    estimated: bool
    notes: str = ""
    # Full-attention layers whose KV geometry differs from the sliding layers (Gemma 4).
    full_attention_num_kv_heads: int | None = None
    full_attention_head_dim: int | None = None
    # Tokens per stored KV row in full-attention layers (DeepSeek-V4's compressed attention).
    full_attention_kv_compression: float = 1.0
    # Mixture of experts: routed experts per layer, experts each token uses, and the
    # parameters (billions) and bytes per parameter of all routed experts together.
    num_experts: int | None = None
    experts_per_token: int | None = None
    expert_params_b: float | None = None
    expert_bytes_per_param: float | None = None
    # Recurrent layers (linear attention such as Gated DeltaNet, or Mamba) keep a fixed
    # state per sequence instead of a KV cache: how many, and the bytes of one's state.
    recurrent_layers: int | None = None
    recurrent_state_bytes: float | None = None

    @property
    def is_moe(self) -> bool:
        """Whether only part of the weights is active per token."""
        return self.active_params_b < self.params_b

    @property
    def sliding_layers(self) -> int:
        """Number of sliding-window layers."""
        if self.sliding_window is None:
            return 0
        return round(self.layers * self.sliding_window_layer_fraction)

    @property
    def full_attention_layers(self) -> int:
        """Number of layers that attend over the whole context."""
        return self.layers - self.sliding_layers - (self.recurrent_layers or 0)

    def recurrent_bytes(self) -> float:
        """The fixed state one sequence keeps across all recurrent layers (0 without)."""
        return (self.recurrent_layers or 0) * (self.recurrent_state_bytes or 0.0)

    def expert_weight_bytes(self) -> float:
        """Bytes of all routed experts (0 for a dense model)."""
        per_param = self.expert_bytes_per_param or self.weight_bytes_per_param
        return (self.expert_params_b or 0.0) * 1e9 * per_param

    def expert_fraction_read(self, routed_tokens: float) -> float:
        """Expected fraction of experts touched by `routed_tokens` independently routed tokens."""
        if not self.num_experts or not self.experts_per_token:
            return 0.0
        miss = 1.0 - self.experts_per_token / self.num_experts
        return float(1.0 - miss**routed_tokens)

    def weight_bytes(self) -> float:
        """Bytes of weights held in GPU memory (and streamed once per forward step)."""
        return self.params_b * 1e9 * self.weight_bytes_per_param

    def flops_per_token(self) -> float:
        """Matmul FLOPs per token through the weights: 2 per active parameter."""
        return 2 * self.active_params_b * 1e9

    def sliding_layer_kv_bytes_per_token(self) -> float:
        """K+V bytes one token adds to one sliding-window layer."""
        return 2 * self.num_kv_heads * self.head_dim * self.kv_bytes_per_element

    def full_layer_kv_bytes_per_token(self) -> float:
        """K+V bytes one token adds to one full-attention layer (after compression)."""
        kv_heads = self.full_attention_num_kv_heads or self.num_kv_heads
        head_dim = self.full_attention_head_dim or self.head_dim
        row_bytes = 2 * kv_heads * head_dim * self.kv_bytes_per_element
        return row_bytes / self.full_attention_kv_compression

    def kv_bytes_per_token(self) -> float:
        """K+V bytes one token adds across all layers, before any sliding-window cap.

        For a uniform model this is 2 * layers * num_kv_heads * head_dim *
        kv_bytes_per_element. Sliding-window layers stop growing at the window; use
        `kv_bytes_for_context` for the KV a sequence of a given length really holds.
        """
        return (
            self.sliding_layers * self.sliding_layer_kv_bytes_per_token()
            + self.full_attention_layers * self.full_layer_kv_bytes_per_token()
        )

    def kv_bytes_for_context(self, tokens: int) -> float:
        """KV bytes one sequence of `tokens` tokens holds, sliding layers capped at the window,
        recurrent layers at their fixed state."""
        if tokens < 0:
            raise ValueError(f"tokens must be >= 0, got {tokens}")
        window_tokens = min(tokens, self.sliding_window or 0)
        return (
            self.sliding_layers * self.sliding_layer_kv_bytes_per_token() * window_tokens
            + self.full_attention_layers * self.full_layer_kv_bytes_per_token() * tokens
            + self.recurrent_bytes()
        )


@dataclass(frozen=True, slots=True)
class GpuPriceSpec:
    """A default price for one GPU type and pricing kind, with where it came from."""

    gpu_type: str
    kind: PriceKind
    usd_per_gpu_hour: float
    source: str
    date: dt.date
    notes: str = ""


class _Named(Protocol):
    """A catalog entry findable by name and aliases."""

    @property
    def name(self) -> str: ...

    @property
    def aliases(self) -> tuple[str, ...]: ...


_N = TypeVar("_N", bound=_Named)


def _data_file(name: str) -> Traversable:
    """A data file shipped in the planner package."""
    return resources.files("planner").joinpath("data", name)


def _check_model(spec: ModelSpec, file: str) -> ModelSpec:
    """Cross-field checks a single value cannot express."""
    problem = None
    if spec.active_params_b > spec.params_b:
        problem = "active_params_b must not exceed params_b"
    elif spec.sliding_window_layer_fraction > 0 and spec.sliding_window is None:
        problem = "sliding_window_layer_fraction > 0 needs a sliding_window"
    elif spec.is_moe and None in (spec.num_experts, spec.experts_per_token, spec.expert_params_b):
        problem = "an MoE model needs num_experts, experts_per_token and expert_params_b"
    elif (spec.recurrent_layers is None) != (spec.recurrent_state_bytes is None):
        problem = "recurrent_layers and recurrent_state_bytes go together"
    elif spec.sliding_layers + (spec.recurrent_layers or 0) > spec.layers:
        problem = "sliding and recurrent layers exceed the layers"
    elif spec.full_attention_kv_compression < 1:
        problem = "full_attention_kv_compression must be >= 1"
    if problem:
        raise CatalogError(f"{file}: entry {spec.name!r}: {problem}")
    return spec


def _index(entries: Iterable[_N], file: str) -> dict[str, _N]:
    """Case-insensitive lookup by name, alias and (for "org/model") the bare model name."""
    index: dict[str, _N] = {}
    for entry in entries:
        keys = {entry.name, *entry.aliases, entry.name.rsplit("/", 1)[-1]}
        for key in {k.lower() for k in keys}:
            other = index.setdefault(key, entry)
            if other is not entry:
                raise CatalogError(f"{file}: {key!r} names both {other.name!r} and {entry.name!r}")
    return index


def _load_gpus(file: Traversable | Path) -> dict[str, GpuSpec]:
    """GPU specs from a gpus.yaml file, by lower-cased name and alias."""
    return _index(load_entries(file, "gpus", GpuSpec), file.name)


def _load_models(file: Traversable | Path) -> dict[str, ModelSpec]:
    """Model specs from a models.yaml file, by lower-cased name and alias."""
    specs = load_entries(file, "models", ModelSpec)
    return _index((_check_model(spec, file.name) for spec in specs), file.name)


def _load_prices(file: Traversable | Path, gpu_names: Iterable[str]) -> tuple[GpuPriceSpec, ...]:
    """Prices from a prices.yaml file; each for a known GPU and unique per (gpu, kind)."""
    prices = load_entries(file, "prices", GpuPriceSpec)
    known, seen = set(gpu_names), set()
    for price in prices:
        key = (price.gpu_type, price.kind)
        where = f"{file.name}: entry '{price.gpu_type} ({price.kind})'"
        if price.gpu_type not in known:
            raise CatalogError(f"{where}: gpu_type must be one of {sorted(known)}")
        if key in seen:
            raise CatalogError(f"{where}: a second price for the same (gpu_type, kind)")
        seen.add(key)
    return prices


@functools.cache
def _gpu_index() -> Mapping[str, GpuSpec]:
    return MappingProxyType(_load_gpus(_data_file("gpus.yaml")))


@functools.cache
def _model_index() -> Mapping[str, ModelSpec]:
    return MappingProxyType(_load_models(_data_file("models.yaml")))


def _canonical(index: Mapping[str, _N]) -> Mapping[str, _N]:
    """The distinct entries of a lookup index, by canonical name."""
    return MappingProxyType({spec.name: spec for spec in index.values()})


@functools.cache
def gpus() -> Mapping[str, GpuSpec]:
    """Every catalogued GPU by canonical name, in file order."""
    return _canonical(_gpu_index())


@functools.cache
def models() -> Mapping[str, ModelSpec]:
    """Every catalogued verifier model by canonical name, in file order."""
    return _canonical(_model_index())


def _lookup(index: Mapping[str, _N], name: str, what: str, known: Iterable[str]) -> _N:
    """The entry `name` in `index`, or UnknownCatalogEntry listing the known names."""
    found = index.get(name.strip().lower())
    if found is None:
        raise UnknownCatalogEntry(f"unknown {what} {name!r}; known: {', '.join(known)}")
    return found


def gpu(name: str) -> GpuSpec:
    """The GPU called `name` (canonical name or alias, any case)."""
    return _lookup(_gpu_index(), name, "GPU", gpus())


def model(name: str) -> ModelSpec:
    """The model called `name` (HF id, bare model name or alias, any case)."""
    return _lookup(_model_index(), name, "model", models())


@functools.cache
def default_prices() -> tuple[GpuPriceSpec, ...]:
    """The default GPU prices shipped with draftgate."""
    return _load_prices(_data_file("prices.yaml"), gpus())


def default_price(gpu_type: str, kind: PriceKind = "on-demand") -> GpuPriceSpec:
    """The default price of `gpu_type` (name or alias) for `kind`."""
    canonical = gpu(gpu_type).name
    for price in default_prices():
        if price.gpu_type == canonical and price.kind == kind:
            return price
    have = [p.kind for p in default_prices() if p.gpu_type == canonical]
    raise UnknownCatalogEntry(
        f"no default {kind} price for {canonical}; it has: {', '.join(have) or 'none'}"
    )
