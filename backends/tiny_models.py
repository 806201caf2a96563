"""Tiny random models that real vLLM serves on a CPU, built locally (no hub, no torch).

A 2-layer Llama target with a locally trained tokenizer, and randomly initialised drafters
in the checkpoint layouts vLLM loads: EAGLE-3 (native and Speculators formats), P-EAGLE,
DFlash and DSpark. Weights are written with numpy and safetensors, configs as JSON, all
from one seed, so the same seed gives byte-identical files. Random drafters are accepted
~0 % of the time; the target serving as its own `draft_model` gives high acceptance.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from backends.tiny_tokenizer import (
    MAX_CONTEXT_TOKENS,
    SpecialIds,
    corpus_files,
    save_tokenizer,
    special_ids,
    train_tokenizer,
    write_json,
)

Tensors = dict[str, np.ndarray]
Config = dict[str, object]

INIT_STD = 0.02  # transformers' initializer_range for Llama
RMS_NORM_EPS = 1e-6
ROPE_THETA = 10000.0
AUX_LAYER_IDS = (0, 1, 2)  # EAGLE-3 reads the embeddings and both target layers' outputs
DFLASH_TARGET_LAYER_IDS = (0, 1)  # DFlash/DSpark index target layers from 0 (aux id - 1)
DRAFT_BLOCK_SIZE = 4
MARKOV_RANK = 16
SPECULATORS_K = 3  # the speculative tokens a Speculators checkpoint proposes


@dataclass(frozen=True)
class Shape:
    """Sizes of a decoder; `hidden // heads` must be a head size vLLM's CPU attention takes."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


TARGET = Shape(hidden=128, layers=2, heads=4, kv_heads=2, intermediate=256, vocab=2048)
DRAFTER = Shape(hidden=128, layers=1, heads=4, kv_heads=2, intermediate=256, vocab=2048)
CPU_HEAD_SIZES = frozenset({32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512})


@dataclass(frozen=True)
class TinyModels:
    """Where each model directory was written."""

    target: Path
    eagle3: Path
    eagle3_speculators: Path
    peagle: Path
    dflash: Path
    dspark: Path


def tiny_model_paths(root: Path) -> TinyModels:
    """Where `build_tiny_models(root)` writes each model."""
    return TinyModels(*(root / name for name in _DIRECTORIES))


def build_tiny_models(root: Path, seed: int = 0) -> TinyModels:
    """Write the target (with its tokenizer) and every drafter under `root`."""
    tokenizer = train_tokenizer(corpus_files())
    ids = special_ids(tokenizer)
    models = tiny_model_paths(root)
    save_tokenizer(tokenizer, models.target)
    target = llama_config(TARGET, ids)
    _write(models.target, target, llama_tensors(TARGET, _rng(seed, 0)))
    _write_generation_config(models.target, ids)
    _write(models.eagle3, eagle3_config(target), eagle3_tensors(_rng(seed, 1), "midlayer."))
    speculators = eagle3_speculators_config(target, models.target)
    _write(models.eagle3_speculators, speculators, eagle3_tensors(_rng(seed, 2), "layers.0."))
    peagle = eagle3_config(target) | {"pard_token": ids.pad}
    _write(models.peagle, peagle, eagle3_tensors(_rng(seed, 3), "midlayer.", mask_hidden=True))
    _write(models.dflash, dflash_config(ids), dflash_tensors(_rng(seed, 4)))
    dspark = dspark_speculators_config(ids, models.target)
    _write(models.dspark, dspark, dflash_tensors(_rng(seed, 5)) | markov_tensors(_rng(seed, 6)))
    return models


_DIRECTORIES = (
    "tiny-llama",
    "tiny-eagle3",
    "tiny-eagle3-speculators",
    "tiny-peagle",
    "tiny-dflash",
    "tiny-dspark",
)


def llama_config(shape: Shape, ids: SpecialIds) -> Config:
    """A Llama `config.json` for `shape`."""
    if shape.head_dim not in CPU_HEAD_SIZES:
        raise ValueError(f"head size {shape.head_dim} is not one vLLM's CPU attention supports")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": shape.hidden,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "intermediate_size": shape.intermediate,
        "vocab_size": shape.vocab,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_CONTEXT_TOKENS,
        "rms_norm_eps": RMS_NORM_EPS,
        "rope_parameters": {"rope_type": "default", "rope_theta": ROPE_THETA},
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "initializer_range": INIT_STD,
        "bos_token_id": ids.bos,
        "eos_token_id": ids.eos,
        "pad_token_id": ids.pad,
        "dtype": "float32",
    }


def eagle3_config(target: Config) -> Config:
    """A native EAGLE-3 head config: the target's Llama config, one layer, aux layer ids."""
    return target | {
        "architectures": ["LlamaForCausalLMEagle3"],
        "num_hidden_layers": DRAFTER.layers,
        "draft_vocab_size": DRAFTER.vocab,
        "target_hidden_size": TARGET.hidden,
        "eagle_aux_hidden_state_layer_ids": list(AUX_LAYER_IDS),
    }


def eagle3_speculators_config(target: Config, target_dir: Path) -> Config:
    """An EAGLE-3 head in the Speculators format; `vllm serve` on it serves its verifier."""
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "transformer_layer_config": target | {"num_hidden_layers": DRAFTER.layers},
        "draft_vocab_size": DRAFTER.vocab,
        "norm_before_residual": False,
        "target_hidden_size": TARGET.hidden,
        "eagle_aux_hidden_state_layer_ids": list(AUX_LAYER_IDS),
        "speculators_config": _speculators_block("eagle3", target_dir),
    }


def dflash_config(ids: SpecialIds) -> Config:
    """A DFlash drafter config: Qwen3 layers reading the target's layers 0 and 1."""
    return qwen3_layer_config(ids) | {
        "architectures": ["DFlashDraftModel"],
        "block_size": DRAFT_BLOCK_SIZE,
        "num_target_layers": TARGET.layers,
        "dflash_config": {
            "mask_token_id": ids.pad,
            "target_layer_ids": list(DFLASH_TARGET_LAYER_IDS),
        },
    }


def dspark_speculators_config(ids: SpecialIds, target_dir: Path) -> Config:
    """A DSpark drafter in the Speculators format (vLLM maps it to `Qwen3DSparkModel`)."""
    return {
        "architectures": ["Qwen3DSparkModel"],
        "speculators_model_type": "dspark",
        "transformer_layer_config": qwen3_layer_config(ids),
        "aux_hidden_state_layer_ids": [i + 1 for i in DFLASH_TARGET_LAYER_IDS],
        "mask_token_id": ids.pad,
        "draft_vocab_size": DRAFTER.vocab,
        "target_hidden_size": TARGET.hidden,
        "markov_rank": MARKOV_RANK,
        "markov_head_type": "vanilla",
        "block_size": DRAFT_BLOCK_SIZE,
        "speculators_config": _speculators_block("dspark", target_dir),
    }


def qwen3_layer_config(ids: SpecialIds) -> Config:
    """A one-layer Qwen3 config of the drafter's shape."""
    return llama_config(DRAFTER, ids) | {"model_type": "qwen3", "architectures": []}


def _speculators_block(algorithm: str, target_dir: Path) -> Config:
    proposal = {"proposal_type": "greedy", "speculative_tokens": SPECULATORS_K}
    return {
        "algorithm": algorithm,
        "default_proposal_method": "greedy",
        "proposal_methods": [proposal],
        "verifier": {
            "name_or_path": str(target_dir.resolve()),
            "architectures": ["LlamaForCausalLM"],
        },
    }


def _rng(seed: int, model_index: int) -> np.random.Generator:
    return np.random.default_rng([seed, model_index])


def _normal(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return (rng.standard_normal(shape) * INIT_STD).astype(np.float32)


def _ones(size: int) -> np.ndarray:
    return np.ones(size, dtype=np.float32)


def attention_tensors(
    prefix: str, shape: Shape, rng: np.random.Generator, input_size: int
) -> Tensors:
    """q/k/v/o projections of one attention block reading `input_size` features."""
    q_out, kv_out = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    return {
        f"{prefix}self_attn.q_proj.weight": _normal(rng, q_out, input_size),
        f"{prefix}self_attn.k_proj.weight": _normal(rng, kv_out, input_size),
        f"{prefix}self_attn.v_proj.weight": _normal(rng, kv_out, input_size),
        f"{prefix}self_attn.o_proj.weight": _normal(rng, shape.hidden, q_out),
    }


def mlp_and_norm_tensors(prefix: str, shape: Shape, rng: np.random.Generator) -> Tensors:
    """The gated MLP and the two RMS norms of one decoder layer."""
    return {
        f"{prefix}mlp.gate_proj.weight": _normal(rng, shape.intermediate, shape.hidden),
        f"{prefix}mlp.up_proj.weight": _normal(rng, shape.intermediate, shape.hidden),
        f"{prefix}mlp.down_proj.weight": _normal(rng, shape.hidden, shape.intermediate),
        f"{prefix}input_layernorm.weight": _ones(shape.hidden),
        f"{prefix}post_attention_layernorm.weight": _ones(shape.hidden),
    }


def llama_tensors(shape: Shape, rng: np.random.Generator) -> Tensors:
    """Every weight of a `LlamaForCausalLM`."""
    tensors = {"model.embed_tokens.weight": _normal(rng, shape.vocab, shape.hidden)}
    for layer in range(shape.layers):
        prefix = f"model.layers.{layer}."
        tensors |= attention_tensors(prefix, shape, rng, shape.hidden)
        tensors |= mlp_and_norm_tensors(prefix, shape, rng)
    tensors["model.norm.weight"] = _ones(shape.hidden)
    tensors["lm_head.weight"] = _normal(rng, shape.vocab, shape.hidden)
    return tensors


def eagle3_tensors(rng: np.random.Generator, prefix: str, *, mask_hidden: bool = False) -> Tensors:
    """An EAGLE-3 head: one layer over [embedding, fused hidden], `fc` fusing the aux layers.

    No `embed_tokens` (vLLM shares the target's) and no vocab maps (same vocabulary).
    P-EAGLE adds `mask_hidden`, the hidden state fed at masked positions.
    """
    fused = len(AUX_LAYER_IDS) * TARGET.hidden
    tensors = attention_tensors(prefix, DRAFTER, rng, 2 * DRAFTER.hidden)
    tensors |= mlp_and_norm_tensors(prefix, DRAFTER, rng)
    tensors[f"{prefix}hidden_norm.weight"] = _ones(DRAFTER.hidden)
    tensors["norm.weight"] = _ones(DRAFTER.hidden)
    tensors["fc.weight"] = _normal(rng, DRAFTER.hidden, fused)
    tensors["lm_head.weight"] = _normal(rng, DRAFTER.vocab, DRAFTER.hidden)
    if mask_hidden:
        tensors["mask_hidden"] = _normal(rng, fused)
    return tensors


def dflash_tensors(rng: np.random.Generator) -> Tensors:
    """A DFlash (and DSpark backbone) drafter: Qwen3 layers with q/k norms, `fc` over the
    target layers, embeddings and LM head shared from the target."""
    tensors: Tensors = {}
    for layer in range(DRAFTER.layers):
        prefix = f"layers.{layer}."
        tensors |= attention_tensors(prefix, DRAFTER, rng, DRAFTER.hidden)
        tensors[f"{prefix}self_attn.q_norm.weight"] = _ones(DRAFTER.head_dim)
        tensors[f"{prefix}self_attn.k_norm.weight"] = _ones(DRAFTER.head_dim)
        tensors |= mlp_and_norm_tensors(prefix, DRAFTER, rng)
    fused = len(DFLASH_TARGET_LAYER_IDS) * TARGET.hidden
    tensors["fc.weight"] = _normal(rng, DRAFTER.hidden, fused)
    tensors["hidden_norm.weight"] = _ones(DRAFTER.hidden)
    tensors["norm.weight"] = _ones(DRAFTER.hidden)
    return tensors


def markov_tensors(rng: np.random.Generator) -> Tensors:
    """DSpark's low-rank Markov head: previous token -> rank-r embedding -> vocab bias."""
    return {
        "markov_head.markov_w1.weight": _normal(rng, TARGET.vocab, MARKOV_RANK),
        "markov_head.markov_w2.weight": _normal(rng, DRAFTER.vocab, MARKOV_RANK),
    }


def _write(directory: Path, config: Config, tensors: Tensors) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    write_json(directory / "config.json", config)
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})


def _write_generation_config(directory: Path, ids: SpecialIds) -> None:
    document = {"bos_token_id": ids.bos, "eos_token_id": ids.eos, "pad_token_id": ids.pad}
    write_json(directory / "generation_config.json", document)
