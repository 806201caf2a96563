"""Hardware catalog: shipped data, hand-computed derived quantities, lookups, validation."""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path
from typing import Any

import pytest
import yaml

from planner import catalog, datafile
from planner.catalog import CatalogError, UnknownCatalogEntry

REQUIRED_MODELS = [
    "Qwen/Qwen3-4B",
    "Qwen/Qwen3-8B",
    "Qwen/Qwen3-14B",
    "Qwen/Qwen3-30B-A3B",
    "Qwen/Qwen3-Coder-30B-A3B-Instruct",
    "Qwen/Qwen3.5-27B",
    "Qwen/Qwen3.6-35B-A3B",
    "openai/gpt-oss-20b",
    "openai/gpt-oss-120b",
    "google/gemma-4-12B-it",
    "google/gemma-4-31B-it",
    "meta-llama/Llama-3.1-8B-Instruct",
    "deepseek-ai/DeepSeek-V4-Flash",
    "deepseek-ai/DeepSeek-V4-Pro",
    "meta-llama/Llama-3.1-70B-Instruct",
    "meta-llama/Llama-3.3-70B-Instruct",
    "Qwen/Qwen3-0.6B",
    "Qwen/Qwen3-1.7B",
    "Qwen/Qwen3-32B",
    "Qwen/Qwen3-235B-A22B",
    "deepseek-ai/DeepSeek-V3",
    "deepseek-ai/DeepSeek-R1",
]
REQUIRED_PRICES = [
    ("B200", "on-demand"),
    ("B200", "reserved"),
    ("H100", "on-demand"),
    ("H100", "reserved"),
    ("H200", "on-demand"),
    ("A100-80GB", "on-demand"),
]


# --- GPUs -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "memory_bytes", "hbm_bytes_per_s", "bf16_flops", "fp8_flops", "fp4_flops"),
    [
        ("H100", 80e9, 3.35e12, 989.5e12, 1979e12, None),
        ("H200", 141e9, 4.8e12, 989.5e12, 1979e12, None),
        ("A100-80GB", 80e9, 2.039e12, 312e12, None, None),
        ("B200", 180e9, 8e12, 2.25e15, 4.5e15, 9e15),
    ],
)
def test_gpu_units(
    name: str,
    memory_bytes: float,
    hbm_bytes_per_s: float,
    bf16_flops: float,
    fp8_flops: float | None,
    fp4_flops: float | None,
) -> None:
    spec = catalog.gpu(name)
    assert spec.memory_bytes == pytest.approx(memory_bytes)
    assert spec.hbm_bytes_per_s == pytest.approx(hbm_bytes_per_s)
    assert spec.bf16_flops_per_s == pytest.approx(bf16_flops)
    assert spec.fp8_flops_per_s == (None if fp8_flops is None else pytest.approx(fp8_flops))
    assert spec.fp4_flops_per_s == (None if fp4_flops is None else pytest.approx(fp4_flops))


@pytest.mark.parametrize(
    ("gpu_name", "nvlink_bytes_per_s"), [("H100", 900e9), ("B200", 1.8e12), ("L40S", None)]
)
def test_nvlink_bytes_per_s(gpu_name: str, nvlink_bytes_per_s: float | None) -> None:
    assert catalog.gpu(gpu_name).nvlink_bytes_per_s == nvlink_bytes_per_s


@pytest.mark.parametrize(
    ("query", "canonical"),
    [
        ("H100", "H100"),
        ("h100", "H100"),
        ("H100-SXM", "H100"),
        ("H100 SXM5", "H100"),
        (" b200 ", "B200"),
        ("HGX-B200", "B200"),
        ("A100", "A100-80GB"),
        ("a100-sxm", "A100-80GB"),
        ("H200-SXM", "H200"),
    ],
)
def test_gpu_aliases(query: str, canonical: str) -> None:
    assert catalog.gpu(query).name == canonical


def test_gpus_are_keyed_by_canonical_name() -> None:
    assert {"B200", "H100", "H200", "A100-80GB"} <= set(catalog.gpus())
    assert all(key == spec.name for key, spec in catalog.gpus().items())


def test_dense_compute_is_half_the_sparse_datasheet_figure() -> None:
    # H100 SXM datasheet: 1,979 TF BF16* and 3,958 TF FP8* with sparsity.
    h100 = catalog.gpu("H100")
    assert h100.bf16_dense_tflops * 2 == pytest.approx(1979)
    assert h100.fp8_dense_tflops == pytest.approx(3958 / 2)


# --- models -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "kv_bytes_per_token"),
    [
        ("Qwen/Qwen3-8B", 2 * 36 * 8 * 128 * 2),  # 147456
        ("Qwen/Qwen3-4B", 2 * 36 * 8 * 128 * 2),
        ("Qwen/Qwen3-14B", 2 * 40 * 8 * 128 * 2),  # 163840
        ("Qwen/Qwen3-30B-A3B", 2 * 48 * 4 * 128 * 2),  # 98304
        ("meta-llama/Llama-3.1-8B-Instruct", 2 * 32 * 8 * 128 * 2),  # 131072
        ("openai/gpt-oss-20b", 2 * 24 * 8 * 64 * 2),  # 49152
        ("deepseek-ai/DeepSeek-V3", 61 * 576 * 2),  # MLA: one 512 + 64 latent row per layer
        ("meta-llama/Llama-3.1-70B-Instruct", 2 * 80 * 8 * 128 * 2),  # 327680
        ("openai/gpt-oss-120b", 2 * 36 * 8 * 64 * 2),  # 73728
        # 50 sliding layers of 16 KV x 256 + 10 full layers of 4 KV x 512.
        ("google/gemma-4-31B-it", 50 * 2 * 16 * 256 * 2 + 10 * 2 * 4 * 512 * 2),  # 901120
        # 41 compressed layers, one 512-dim fp8 K+V row per 11 tokens, + 2 window layers.
        ("deepseek-ai/DeepSeek-V4-Flash", 41 * 2 * 512 / 11 + 2 * 2 * 512),
    ],
)
def test_kv_bytes_per_token(name: str, kv_bytes_per_token: float) -> None:
    assert catalog.model(name).kv_bytes_per_token() == pytest.approx(kv_bytes_per_token)


@pytest.mark.parametrize(
    ("name", "tokens", "kv_bytes"),
    [
        ("Qwen/Qwen3-8B", 1000, 147456 * 1000),
        ("Qwen/Qwen3-8B", 0, 0),
        # Below the 128-token window every layer holds every token.
        ("openai/gpt-oss-20b", 100, 24 * 2048 * 100),
        # 12 sliding layers capped at 128 tokens + 12 full layers; 2048 B per layer-token.
        ("openai/gpt-oss-20b", 1000, 12 * 2048 * 128 + 12 * 2048 * 1000),
        # 40 sliding layers (8 KV x 256) capped at 1024 + 8 full layers (1 KV x 512).
        ("google/gemma-4-12B-it", 4096, 40 * 8192 * 1024 + 8 * 2048 * 4096),
    ],
)
def test_kv_bytes_for_context(name: str, tokens: int, kv_bytes: float) -> None:
    assert catalog.model(name).kv_bytes_for_context(tokens) == pytest.approx(kv_bytes)


def test_kv_bytes_for_negative_context_is_an_error() -> None:
    with pytest.raises(ValueError, match="tokens"):
        catalog.model("Qwen/Qwen3-8B").kv_bytes_for_context(-1)


@pytest.mark.parametrize(
    ("name", "flops_per_token", "weight_bytes"),
    [
        ("Qwen/Qwen3-8B", 2 * 8.19e9, 8.19e9 * 2),
        ("Qwen/Qwen3-30B-A3B", 2 * 3.3e9, 30.5e9 * 2),
        ("openai/gpt-oss-20b", 2 * 3.6e9, 20.9e9 * 0.6575),  # ~13.7 GB checkpoint
        ("openai/gpt-oss-120b", 2 * 5.1e9, 116.8e9 * 0.558),  # ~65 GB checkpoint
        ("meta-llama/Llama-3.1-8B-Instruct", 2 * 8.03e9, 8.03e9 * 2),
    ],
)
def test_flops_and_weight_bytes(name: str, flops_per_token: float, weight_bytes: float) -> None:
    spec = catalog.model(name)
    assert spec.flops_per_token() == pytest.approx(flops_per_token)
    assert spec.weight_bytes() == pytest.approx(weight_bytes)


@pytest.mark.parametrize(
    ("name", "sliding_layers", "is_moe"),
    [
        ("Qwen/Qwen3-8B", 0, False),
        ("Qwen/Qwen3-30B-A3B", 0, True),
        ("openai/gpt-oss-20b", 12, True),
        ("google/gemma-4-12B-it", 40, False),
        ("google/gemma-4-31B-it", 50, False),
        ("deepseek-ai/DeepSeek-V4-Flash", 2, True),
    ],
)
def test_layer_split_and_moe(name: str, sliding_layers: int, is_moe: bool) -> None:
    spec = catalog.model(name)
    assert spec.sliding_layers == sliding_layers
    assert spec.full_attention_layers == spec.layers - sliding_layers
    assert spec.is_moe is is_moe


def test_gpt_oss_120b_weights_fit_one_h100() -> None:
    assert catalog.model("gpt-oss-120b").weight_bytes() < catalog.gpu("H100").memory_bytes


@pytest.mark.parametrize(
    ("query", "canonical"),
    [
        ("Qwen/Qwen3-8B", "Qwen/Qwen3-8B"),
        ("qwen/qwen3-8b", "Qwen/Qwen3-8B"),
        ("qwen3-8b", "Qwen/Qwen3-8B"),
        ("gpt-oss-20b", "openai/gpt-oss-20b"),
        ("Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B-Instruct"),
        ("llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct"),
        ("gemma-4-31b", "google/gemma-4-31B-it"),
        ("qwen3-coder-30b-a3b", "Qwen/Qwen3-Coder-30B-A3B-Instruct"),
        ("DeepSeek-V4-Flash", "deepseek-ai/DeepSeek-V4-Flash"),
    ],
)
def test_model_aliases(query: str, canonical: str) -> None:
    assert catalog.model(query).name == canonical


def test_every_verifier_model_is_catalogued() -> None:
    assert list(catalog.models()) == REQUIRED_MODELS


@pytest.mark.parametrize(
    "name",
    [
        "google/gemma-4-12B-it",
        "google/gemma-4-31B-it",
        "deepseek-ai/DeepSeek-V4-Flash",
        "deepseek-ai/DeepSeek-V4-Pro",
        "Qwen/Qwen3.5-27B",
        "Qwen/Qwen3.6-35B-A3B",
    ],
)
def test_uncertain_models_are_marked_estimated(name: str) -> None:
    spec = catalog.model(name)
    assert spec.estimated
    assert "estimated" in spec.notes.lower() or "assumed" in spec.notes.lower()


def test_recurrent_layers_keep_a_fixed_state_beside_the_kv_cache() -> None:
    """Qwen3.5-27B: 16 full-attention layers of 4 KV heads x 256 grow with the context;
    48 Gated DeltaNet layers hold 3.2 MB each whatever the length."""
    spec = catalog.model("Qwen/Qwen3.5-27B")
    assert spec.full_attention_layers == 16
    per_token = 16 * 2 * 4 * 256 * 2
    for tokens in (0, 1000, 100_000):
        assert spec.kv_bytes_for_context(tokens) == per_token * tokens + 48 * 3207168


def test_every_entry_has_an_https_source() -> None:
    entries = [*catalog.gpus().values(), *catalog.models().values()]
    assert all(entry.source.startswith("https://") for entry in entries)


def test_specs_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        catalog.gpu("H100").memory_gb = 1  # type: ignore[misc]


# --- unknown names ----------------------------------------------------------------------


def test_unknown_gpu_lists_the_known_ones() -> None:
    with pytest.raises(UnknownCatalogEntry) as info:
        catalog.gpu("V100")
    assert isinstance(info.value, KeyError)
    message = str(info.value)
    assert message.startswith("unknown GPU 'V100'; known: ")
    assert "B200" in message
    assert "A100-80GB" in message


def test_unknown_model_lists_the_known_ones() -> None:
    with pytest.raises(UnknownCatalogEntry, match=r"unknown model 'acme/tiny'.*Qwen/Qwen3-8B"):
        catalog.model("acme/tiny")


# --- prices -----------------------------------------------------------------------------


def test_prices_are_unique_per_gpu_and_kind() -> None:
    keys = [(p.gpu_type, p.kind) for p in catalog.default_prices()]
    assert len(keys) == len(set(keys))
    assert set(REQUIRED_PRICES) <= set(keys)


def test_prices_are_sourced_dated_and_plausible() -> None:
    for price in catalog.default_prices():
        assert price.gpu_type in catalog.gpus()
        assert price.source
        assert price.notes
        assert dt.date(2025, 1, 1) <= price.date <= dt.date(2026, 12, 31)
        assert 0.5 <= price.usd_per_gpu_hour <= 15


def test_reserved_is_cheaper_than_on_demand() -> None:
    for gpu_name in ("B200", "H100"):
        reserved = catalog.default_price(gpu_name, "reserved").usd_per_gpu_hour
        assert reserved < catalog.default_price(gpu_name).usd_per_gpu_hour


def test_default_price_resolves_aliases() -> None:
    price = catalog.default_price("h100-sxm")
    assert (price.gpu_type, price.kind) == ("H100", "on-demand")


def test_missing_default_price_is_unknown() -> None:
    with pytest.raises(UnknownCatalogEntry, match="no default spot price for H200"):
        catalog.default_price("H200", "spot")


# --- malformed data files ---------------------------------------------------------------

GOOD_GPU: dict[str, Any] = {
    "name": "X100",
    "aliases": ["X100-SXM"],
    "memory_gb": 80,
    "hbm_bandwidth_tb_s": 3,
    "bf16_dense_tflops": 1000,
    "fp8_dense_tflops": None,
    "fp4_dense_tflops": None,
    "nvlink_gb_s": 900,
    "tdp_w": 700,
    "source": "https://example.com/x100",
}
GOOD_MODEL: dict[str, Any] = {
    "name": "acme/tiny",
    "aliases": ["tiny"],
    "params_b": 1,
    "active_params_b": 1,
    "layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_kv_heads": 2,
    "head_dim": 16,
    "vocab_size": 100,
    "weight_dtype": "bf16",
    "weight_bytes_per_param": 2,
    "kv_bytes_per_element": 2,
    "sliding_window": None,
    "sliding_window_layer_fraction": 0,
    "max_context": 4096,
    "source": "https://example.com/tiny",
    "estimated": False,
}
GOOD_PRICE: dict[str, Any] = {
    "gpu_type": "H100",
    "kind": "on-demand",
    "usd_per_gpu_hour": 2.5,
    "source": "somewhere",
    "date": "2026-01-01",
}


@pytest.mark.parametrize("cls", [catalog.GpuSpec, catalog.ModelSpec, catalog.GpuPriceSpec])
def test_every_field_type_has_a_reader(cls: type) -> None:
    for field in dataclasses.fields(cls):
        assert str(field.type).removesuffix(" | None") in datafile.READERS, field.name


def _write(tmp_path: Path, key: str, entries: list[dict[str, Any]]) -> Path:
    path = tmp_path / f"{key}.yaml"
    path.write_text(yaml.safe_dump({key: entries}), encoding="utf-8")
    return path


def test_valid_minimal_files_load(tmp_path: Path) -> None:
    gpus = catalog._load_gpus(_write(tmp_path, "gpus", [GOOD_GPU]))
    assert gpus["x100-sxm"].hbm_bytes_per_s == 3e12
    models = catalog._load_models(_write(tmp_path, "models", [GOOD_MODEL]))
    assert models["tiny"].kv_bytes_per_token() == 2 * 2 * 2 * 16 * 2
    prices = catalog._load_prices(_write(tmp_path, "prices", [GOOD_PRICE]), ["H100"])
    assert prices[0].date == dt.date(2026, 1, 1)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"memory_gb": -80}, "'memory_gb' must be a positive number"),
        ({"memory_gb": True}, "'memory_gb' must be a positive number"),
        ({"source": ""}, "'source' must be a non-empty string"),
        ({"memory_gib": 80}, "unknown keys ['memory_gib']"),
        ({"aliases": "X100-SXM"}, "'aliases' must be a list"),
        ({"fp8_dense_tflops": 0}, "'fp8_dense_tflops' must be a positive number"),
    ],
)
def test_malformed_gpu_names_file_and_entry(
    tmp_path: Path, changes: dict[str, Any], message: str
) -> None:
    path = _write(tmp_path, "gpus", [{**GOOD_GPU, **changes}])
    with pytest.raises(CatalogError) as info:
        catalog._load_gpus(path)
    assert str(info.value).startswith("gpus.yaml: entry 'X100': ")
    assert message in str(info.value)


def test_missing_gpu_key_is_named(tmp_path: Path) -> None:
    entry = {k: v for k, v in GOOD_GPU.items() if k != "tdp_w"}
    with pytest.raises(CatalogError, match=r"gpus.yaml: entry 'X100': missing required key"):
        catalog._load_gpus(_write(tmp_path, "gpus", [entry]))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"sliding_window_layer_fraction": 1.5}, "must be a number in [0, 1]"),
        ({"sliding_window_layer_fraction": 0.5}, "needs a sliding_window"),
        ({"active_params_b": 2}, "active_params_b must not exceed params_b"),
        ({"weight_dtype": "int4"}, "'weight_dtype' must be one of"),
        ({"layers": 2.5}, "'layers' must be a positive integer"),
        ({"estimated": "no"}, "'estimated' must be true or false"),
        ({"full_attention_kv_compression": 0.5}, "must be >= 1"),
    ],
)
def test_malformed_model_names_file_and_entry(
    tmp_path: Path, changes: dict[str, Any], message: str
) -> None:
    path = _write(tmp_path, "models", [{**GOOD_MODEL, **changes}])
    with pytest.raises(CatalogError) as info:
        catalog._load_models(path)
    assert str(info.value).startswith("models.yaml: entry 'acme/tiny': ")
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ([GOOD_PRICE, {**GOOD_PRICE, "usd_per_gpu_hour": 3}], "a second price for the same"),
        ([{**GOOD_PRICE, "gpu_type": "V100"}], "gpu_type must be one of ['H100']"),
        ([{**GOOD_PRICE, "date": "last year"}], "must be a YYYY-MM-DD date"),
        ([{**GOOD_PRICE, "kind": "hourly"}], "'kind' must be one of"),
    ],
)
def test_malformed_prices_name_file_and_entry(
    tmp_path: Path, entries: list[dict[str, Any]], message: str
) -> None:
    path = _write(tmp_path, "prices", entries)
    with pytest.raises(CatalogError) as info:
        catalog._load_prices(path, ["H100"])
    assert str(info.value).startswith("prices.yaml: entry '")
    assert message in str(info.value)


def test_alias_shared_by_two_entries_is_an_error(tmp_path: Path) -> None:
    other = {**GOOD_GPU, "name": "X200"}
    with pytest.raises(CatalogError, match="'x100-sxm' names both 'X100' and 'X200'"):
        catalog._load_gpus(_write(tmp_path, "gpus", [GOOD_GPU, other]))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("gpus: [unclosed", "not valid YAML"),
        ("- name: X100\n", "must be a mapping with a non-empty 'gpus' list"),
        ("gpus: []\n", "must be a mapping with a non-empty 'gpus' list"),
        ("gpus: [42]\n", "entry '#0': must be a mapping"),
    ],
)
def test_malformed_file_shape(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "gpus.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(CatalogError, match=r"^gpus\.yaml: ") as info:
        catalog._load_gpus(path)
    assert message in str(info.value)
