"""The tiny local models: files in vLLM's layouts, tensor shapes, a working tokenizer and chat
template, and the same bytes from the same seed."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import jinja2
import pytest
from safetensors.numpy import load_file
from tokenizers import Tokenizer
from typer.testing import CliRunner

from backends.tiny_models import (
    AUX_LAYER_IDS,
    DFLASH_TARGET_LAYER_IDS,
    MARKOV_RANK,
    TARGET,
    Shape,
    TinyModels,
    build_tiny_models,
    llama_config,
)
from backends.tiny_tokenizer import CHAT_TEMPLATE, SpecialIds
from gateway.cli.main import app

H, V = TARGET.hidden, TARGET.vocab


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    return build_tiny_models(tmp_path_factory.mktemp("tiny"))


def _config(directory: Path) -> dict[str, object]:
    document: dict[str, object] = json.loads((directory / "config.json").read_text())
    return document


def _shapes(directory: Path) -> dict[str, tuple[int, ...]]:
    return {name: t.shape for name, t in load_file(directory / "model.safetensors").items()}


def test_every_model_directory_has_its_files(models: TinyModels) -> None:
    target_files = {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "chat_template.jinja",
    }
    assert {p.name for p in models.target.iterdir()} == target_files
    for drafter in (
        models.eagle3,
        models.eagle3_speculators,
        models.peagle,
        models.dflash,
        models.dspark,
    ):
        assert {p.name for p in drafter.iterdir()} == {"config.json", "model.safetensors"}


def test_the_target_is_a_two_layer_llama(models: TinyModels) -> None:
    config = _config(models.target)
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["hidden_size"], config["num_hidden_layers"], config["head_dim"]) == (H, 2, 32)
    shapes = _shapes(models.target)
    assert shapes["model.embed_tokens.weight"] == (V, H)
    assert shapes["lm_head.weight"] == (V, H)
    assert shapes["model.layers.1.self_attn.q_proj.weight"] == (4 * 32, H)
    assert shapes["model.layers.1.self_attn.k_proj.weight"] == (2 * 32, H)
    assert shapes["model.layers.0.mlp.down_proj.weight"] == (H, 256)
    assert len(shapes) == 2 + 1 + 2 * 9  # embeddings, head, final norm, 9 per layer


def test_eagle3_heads_read_three_target_layers(models: TinyModels) -> None:
    native = _config(models.eagle3)
    assert native["architectures"] == ["LlamaForCausalLMEagle3"]
    # Without explicit ids vLLM picks layers a 2-layer target does not have.
    assert native["eagle_aux_hidden_state_layer_ids"] == list(AUX_LAYER_IDS) == [0, 1, 2]
    shapes = _shapes(models.eagle3)
    assert shapes["fc.weight"] == (H, 3 * H)
    assert shapes["midlayer.self_attn.q_proj.weight"] == (4 * 32, 2 * H)
    assert "embed_tokens.weight" not in shapes  # shared from the target
    speculators = _config(models.eagle3_speculators)
    assert speculators["speculators_model_type"] == "eagle3"
    verifier = speculators["speculators_config"]["verifier"]  # type: ignore[index]
    assert verifier["name_or_path"] == str(models.target.resolve())
    assert "layers.0.self_attn.q_proj.weight" in _shapes(models.eagle3_speculators)


def test_p_eagle_has_a_mask_token_and_a_mask_hidden_state(models: TinyModels) -> None:
    config = _config(models.peagle)
    assert config["pard_token"] == 2
    assert _shapes(models.peagle)["mask_hidden"] == (3 * H,)


def test_dflash_and_dspark_drafters(models: TinyModels) -> None:
    dflash = _config(models.dflash)
    assert dflash["architectures"] == ["DFlashDraftModel"]
    assert dflash["model_type"] == "qwen3"
    assert dflash["dflash_config"] == {"mask_token_id": 2, "target_layer_ids": [0, 1]}
    shapes = _shapes(models.dflash)
    assert shapes["fc.weight"] == (H, len(DFLASH_TARGET_LAYER_IDS) * H)
    assert shapes["layers.0.self_attn.q_norm.weight"] == (32,)
    dspark = _config(models.dspark)
    assert dspark["speculators_model_type"] == "dspark"
    assert dspark["aux_hidden_state_layer_ids"] == [1, 2]  # vLLM subtracts one
    spark_shapes = _shapes(models.dspark)
    assert spark_shapes["markov_head.markov_w1.weight"] == (V, MARKOV_RANK)
    assert spark_shapes["markov_head.markov_w2.weight"] == (V, MARKOV_RANK)


def test_the_tokenizer_round_trips_and_knows_its_special_tokens(models: TinyModels) -> None:
    tokenizer = Tokenizer.from_file(str(models.target / "tokenizer.json"))
    assert tokenizer.get_vocab_size() == V
    text = "def add(a, b):\n    return a + b  # ünïcode ✓"
    assert tokenizer.decode(tokenizer.encode(text).ids) == text
    assert len(tokenizer.encode("return value").ids) < len("return value")  # merges learnt
    assert [tokenizer.token_to_id(t) for t in ("<|bos|>", "<|eos|>", "<|pad|>")] == [0, 1, 2]
    config = json.loads((models.target / "tokenizer_config.json").read_text())
    assert (config["eos_token"], config["chat_template"]) == ("<|eos|>", CHAT_TEMPLATE)


def test_the_chat_template_renders_chatml(models: TinyModels) -> None:
    template = jinja2.Template((models.target / "chat_template.jinja").read_text())
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    rendered = template.render(messages=messages, add_generation_prompt=True)
    assert rendered == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    tokenizer = Tokenizer.from_file(str(models.target / "tokenizer.json"))
    ids = tokenizer.encode(rendered).ids
    assert ids[0] == tokenizer.token_to_id("<|im_start|>")
    assert ids.count(tokenizer.token_to_id("<|im_end|>")) == 2


def _digests(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_the_same_seed_gives_the_same_bytes(models: TinyModels, tmp_path: Path) -> None:
    root = models.target.parent
    again = build_tiny_models(tmp_path / "again")
    # Speculators configs name their verifier by absolute path; everything else is equal.
    differing = {
        name
        for name, digest in _digests(root).items()
        if _digests(again.target.parent).get(name) != digest
    }
    assert differing == {"tiny-eagle3-speculators/config.json", "tiny-dspark/config.json"}
    other = build_tiny_models(tmp_path / "other", seed=1)
    assert _shapes(other.target) == _shapes(models.target)
    weights = load_file(other.target / "model.safetensors")["lm_head.weight"]
    assert (weights != load_file(models.target / "model.safetensors")["lm_head.weight"]).any()


def test_a_head_size_vllm_cannot_run_on_cpu_is_refused() -> None:
    with pytest.raises(ValueError, match="head size 48"):
        llama_config(Shape(96, 1, 2, 1, 128, 256), SpecialIds(0, 1, 2))


def test_the_cli_builds_the_models(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["dev", "tiny-models", str(tmp_path / "m")])
    assert result.exit_code == 0, result.output
    assert f"target              {tmp_path / 'm' / 'tiny-llama'}" in result.output
    assert (tmp_path / "m" / "tiny-dflash" / "model.safetensors").is_file()
