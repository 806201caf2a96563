"""Method catalog and vLLM argument rendering, checked against hand-written configs."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from backends.methods import (
    METHOD_IDS,
    METHODS,
    InvalidMethodSpec,
    MethodSpec,
    make_spec,
    method_info,
    render_speculative_config,
    render_vllm_args,
    render_vllm_command,
    spec_from_options,
    validate_spec,
)

DSD_SCHEDULE = [[1, 16, 5], [17, 32, 4], [33, 64, 3], [65, 128, 1], [129, 512, 0]]
PEAGLE_CONFIG = {
    "method": "eagle3",
    "model": "amazon/GPT-OSS-20B-P-EAGLE",
    "num_speculative_tokens": 7,
    "parallel_drafting": True,
}


def test_method_ids_are_canonical() -> None:
    assert METHOD_IDS == (
        "plain",
        "eagle3",
        "p-eagle",
        "dflash",
        "dspark",
        "ngram",
        "suffix",
        "mtp",
        "draft_model",
    )
    assert set(METHODS) == set(METHOD_IDS)


@pytest.mark.parametrize(
    ("method", "vllm_method", "speculative", "parallel", "drafter_required", "adaptive"),
    [
        ("plain", None, False, False, False, False),
        ("eagle3", "eagle3", True, False, True, False),
        ("p-eagle", "eagle3", True, True, True, False),
        ("dflash", "dflash", True, True, True, False),
        ("dspark", "dspark", True, True, False, True),
        ("ngram", "ngram", True, False, False, False),
        ("suffix", "suffix", True, False, False, False),
        ("mtp", "mtp", True, False, False, False),
        ("draft_model", "draft_model", True, False, True, False),
    ],
)
def test_catalog_entry(
    method: str,
    vllm_method: str | None,
    speculative: bool,
    parallel: bool,
    drafter_required: bool,
    adaptive: bool,
) -> None:
    info = method_info(method)
    assert info.id == method
    assert info.vllm_method == vllm_method
    assert info.speculative is speculative
    assert info.parallel is parallel
    assert info.drafter_required is drafter_required
    assert info.supports_adaptive_verification is adaptive
    assert info.description
    assert "\n" not in info.description


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        pytest.param({"method": "plain"}, None, id="plain"),
        pytest.param({"method": "plain", "k": 0}, None, id="plain-k0"),
        pytest.param(
            {"method": "eagle3", "k": 3, "drafter": "RedHatAI/Qwen3-8B-speculator.eagle3"},
            {
                "method": "eagle3",
                "model": "RedHatAI/Qwen3-8B-speculator.eagle3",
                "num_speculative_tokens": 3,
            },
            id="eagle3",
        ),
        pytest.param(
            {"method": "p-eagle", "k": 7, "drafter": "amazon/GPT-OSS-20B-P-EAGLE"},
            PEAGLE_CONFIG,
            id="p-eagle",
        ),
        pytest.param(
            {"method": "dflash", "k": 7, "drafter": "RedHatAI/Qwen3-30B-A3B-speculator.dflash"},
            {
                "method": "dflash",
                "model": "RedHatAI/Qwen3-30B-A3B-speculator.dflash",
                "num_speculative_tokens": 7,
            },
            id="dflash",
        ),
        pytest.param(
            {
                "method": "dflash",
                "k": 15,
                "drafter": "z-lab/Qwen3.5-27B-DFlash",
                "extra": {"attention_backend": "FLASH_ATTN"},
            },
            {
                "method": "dflash",
                "model": "z-lab/Qwen3.5-27B-DFlash",
                "num_speculative_tokens": 15,
                "attention_backend": "FLASH_ATTN",
            },
            id="dflash-extra",
        ),
        pytest.param(
            {
                "method": "dspark",
                "k": 7,
                "drafter": "deepseek-ai/DeepSeek-V4-Flash-DSpark",
                "adaptive_verification": True,
                "extra": {"draft_sample_method": "probabilistic"},
            },
            {
                "method": "dspark",
                "model": "deepseek-ai/DeepSeek-V4-Flash-DSpark",
                "num_speculative_tokens": 7,
                "enable_adaptive_verification": True,
                "draft_sample_method": "probabilistic",
            },
            id="dspark-docs",
        ),
        pytest.param(
            {
                "method": "dspark",
                "k": 7,
                "adaptive_verification": True,
                "extra": {
                    "attention_backend": "FLASH_ATTN",
                    "draft_sample_method": "probabilistic",
                },
            },
            {
                "method": "dspark",
                "num_speculative_tokens": 7,
                "enable_adaptive_verification": True,
                "attention_backend": "FLASH_ATTN",
                "draft_sample_method": "probabilistic",
            },
            id="dspark-no-drafter",
        ),
        pytest.param(
            {"method": "dspark", "k": 5},
            {"method": "dspark", "num_speculative_tokens": 5},
            id="dspark-minimal",
        ),
        pytest.param(
            {
                "method": "eagle3",
                "k": 5,
                "drafter": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
                "k_per_batch_size": DSD_SCHEDULE,
            },
            {
                "method": "eagle3",
                "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
                "num_speculative_tokens": 5,
                "num_speculative_tokens_per_batch_size": DSD_SCHEDULE,
            },
            id="eagle3-dsd",
        ),
        pytest.param(
            {
                "method": "dspark",
                "k": 11,
                "drafter": "deepseek-ai/dspark_qwen3_4b_block7",
                "k_per_batch_size": [(1, 32, 7), (33, 128, 5), (129, 512, 3)],
                "adaptive_verification": True,
            },
            {
                "method": "dspark",
                "model": "deepseek-ai/dspark_qwen3_4b_block7",
                "num_speculative_tokens": 11,
                "num_speculative_tokens_per_batch_size": [[1, 32, 7], [33, 128, 5], [129, 512, 3]],
                "enable_adaptive_verification": True,
            },
            id="dspark-dsd-adaptive",
        ),
        pytest.param(
            {"method": "p-eagle", "k": 7, "drafter": "d", "k_per_batch_size": [[1, 8, 7]]},
            {
                "method": "eagle3",
                "model": "d",
                "num_speculative_tokens": 7,
                "parallel_drafting": True,
                "num_speculative_tokens_per_batch_size": [[1, 8, 7]],
            },
            id="p-eagle-dsd",
        ),
        pytest.param(
            {"method": "ngram", "k": 4, "extra": {"prompt_lookup_max": 5, "prompt_lookup_min": 2}},
            {
                "method": "ngram",
                "num_speculative_tokens": 4,
                "prompt_lookup_max": 5,
                "prompt_lookup_min": 2,
            },
            id="ngram",
        ),
        pytest.param({"method": "suffix"}, {"method": "suffix"}, id="suffix-default-k"),
        pytest.param(
            {"method": "suffix", "k": 24},
            {"method": "suffix", "num_speculative_tokens": 24},
            id="suffix",
        ),
        pytest.param({"method": "mtp"}, {"method": "mtp"}, id="mtp-checkpoint-k"),
        pytest.param(
            {"method": "mtp", "k": 1, "drafter": "deepseek-ai/DeepSeek-V3"},
            {"method": "mtp", "model": "deepseek-ai/DeepSeek-V3", "num_speculative_tokens": 1},
            id="mtp",
        ),
        pytest.param(
            {"method": "draft_model", "k": 4, "drafter": "Qwen/Qwen3-0.6B"},
            {"method": "draft_model", "model": "Qwen/Qwen3-0.6B", "num_speculative_tokens": 4},
            id="draft_model",
        ),
    ],
)
def test_render_speculative_config(kwargs: dict[str, Any], expected: dict[str, Any] | None) -> None:
    config = render_speculative_config(make_spec(**kwargs))
    assert config == expected
    if expected is not None and config is not None:
        assert list(config) == list(expected)  # key order: method, model, K, then the rest


@pytest.mark.parametrize(
    ("model", "spec", "options", "expected"),
    [
        pytest.param(
            "Qwen/Qwen3-8B",
            MethodSpec(method="plain"),
            {"host": "10.0.0.5", "port": 8000, "served_model_name": "qwen3"},
            [
                "vllm",
                "serve",
                "Qwen/Qwen3-8B",
                "--host",
                "10.0.0.5",
                "--port",
                "8000",
                "--served-model-name",
                "qwen3",
            ],
            id="plain",
        ),
        pytest.param(
            "openai/gpt-oss-20b",
            MethodSpec(method="p-eagle", k=7, drafter="amazon/GPT-OSS-20B-P-EAGLE"),
            {},
            [
                "vllm",
                "serve",
                "openai/gpt-oss-20b",
                "--speculative-config",
                '{"method":"eagle3","model":"amazon/GPT-OSS-20B-P-EAGLE",'
                '"num_speculative_tokens":7,"parallel_drafting":true}',
            ],
            id="p-eagle",
        ),
        pytest.param(
            "deepseek-ai/DeepSeek-V4-Flash-DSpark",
            MethodSpec(method="dspark", k=7, adaptive_verification=True),
            {"port": 8101, "extra_args": ["--trust-remote-code"]},
            [
                "vllm",
                "serve",
                "deepseek-ai/DeepSeek-V4-Flash-DSpark",
                "--speculative-config",
                '{"method":"dspark","num_speculative_tokens":7,"enable_adaptive_verification":true}',
                "--port",
                "8101",
                "--trust-remote-code",
            ],
            id="dspark",
        ),
        pytest.param(
            "Qwen/Qwen3-8B",
            MethodSpec(method="suffix"),
            {"host": "127.0.0.1"},
            [
                "vllm",
                "serve",
                "Qwen/Qwen3-8B",
                "--speculative-config",
                '{"method":"suffix"}',
                "--host",
                "127.0.0.1",
            ],
            id="suffix",
        ),
    ],
)
def test_render_vllm_args(
    model: str, spec: MethodSpec, options: dict[str, Any], expected: list[str]
) -> None:
    assert render_vllm_args(model, spec, **options) == expected


def test_render_vllm_args_json_round_trips() -> None:
    spec = make_spec(
        "eagle3", 5, "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", k_per_batch_size=DSD_SCHEDULE
    )
    argv = render_vllm_args("meta-llama/Llama-3.1-8B-Instruct", spec)
    assert json.loads(argv[argv.index("--speculative-config") + 1]) == render_speculative_config(
        spec
    )


def test_render_vllm_command_is_shell_quoted() -> None:
    spec = MethodSpec(method="p-eagle", k=7, drafter="amazon/GPT-OSS-20B-P-EAGLE")
    command = render_vllm_command("openai/gpt-oss-20b", spec, port=8101)
    assert command == (
        "vllm serve openai/gpt-oss-20b --speculative-config "
        '\'{"method":"eagle3","model":"amazon/GPT-OSS-20B-P-EAGLE",'
        '"num_speculative_tokens":7,"parallel_drafting":true}\' --port 8101'
    )


def test_render_vllm_args_rejects_string_extra_args() -> None:
    with pytest.raises(TypeError, match="extra_args"):
        render_vllm_args("m", MethodSpec(method="plain"), extra_args="--enforce-eager")


INVALID_SPECS = [
    ({"method": "peagle", "k": 7}, "unknown method 'peagle'; known: plain, eagle3, p-eagle"),
    (
        {"method": "EAGLE3"},
        "unknown method 'EAGLE3'; known: plain, eagle3, p-eagle, dflash, dspark",
    ),
    ({"method": "plain", "k": 3}, "method 'plain' takes no num_speculative_tokens, got k=3"),
    ({"method": "plain", "k": -1}, "method 'plain' takes no num_speculative_tokens, got k=-1"),
    ({"method": "plain", "drafter": "d"}, "method 'plain' takes no drafter, got drafter='d'"),
    (
        {"method": "plain", "k_per_batch_size": [[1, 8, 0]]},
        "method 'plain' takes no k_per_batch_size, got k_per_batch_size=((1, 8, 0),)",
    ),
    (
        {"method": "plain", "adaptive_verification": True},
        "method 'plain' takes no adaptive_verification, got adaptive_verification=True",
    ),
    (
        {"method": "plain", "extra": {"attention_backend": "FLASH_ATTN"}},
        "method 'plain' takes no extra, got extra={'attention_backend': 'FLASH_ATTN'}",
    ),
    (
        {"method": "eagle3", "k": 0, "drafter": "d"},
        "num_speculative_tokens must be > 0 for method 'eagle3', got k=0",
    ),
    (
        {"method": "dflash", "k": -1, "drafter": "d"},
        "num_speculative_tokens must be > 0 for method 'dflash', got k=-1",
    ),
    (
        {"method": "suffix", "k": 0},
        "num_speculative_tokens must be > 0 for method 'suffix', got k=0",
    ),
    ({"method": "mtp", "k": -2}, "num_speculative_tokens must be > 0 for method 'mtp', got k=-2"),
    ({"method": "eagle3", "drafter": "d"}, "method 'eagle3' needs num_speculative_tokens (k=None)"),
    ({"method": "dspark"}, "method 'dspark' needs num_speculative_tokens (k=None)"),
    ({"method": "ngram"}, "method 'ngram' needs num_speculative_tokens (k=None)"),
    (
        {"method": "eagle3", "k": 2.5, "drafter": "d"},
        "num_speculative_tokens must be an int, got k=2.5",
    ),
    ({"method": "eagle3", "k": True, "drafter": "d"}, "must be an int, got k=True"),
    ({"method": "eagle3", "k": 3}, "method 'eagle3' needs a drafter model (drafter=None)"),
    ({"method": "p-eagle", "k": 7}, "method 'p-eagle' needs a drafter model (drafter=None)"),
    ({"method": "dflash", "k": 7}, "method 'dflash' needs a drafter model (drafter=None)"),
    (
        {"method": "draft_model", "k": 4},
        "method 'draft_model' needs a drafter model (drafter=None)",
    ),
    (
        {"method": "ngram", "k": 4, "drafter": "x"},
        "method 'ngram' does not use a drafter model, got drafter='x'",
    ),
    (
        {"method": "suffix", "drafter": "x"},
        "method 'suffix' does not use a drafter model, got drafter='x'",
    ),
    (
        {"method": "eagle3", "k": 3, "drafter": " "},
        "drafter must be a model name for method 'eagle3', got drafter=' '",
    ),
    (
        {"method": "eagle3", "k": 3, "drafter": "d", "adaptive_verification": True},
        "enable_adaptive_verification is only supported by method 'dspark', got method='eagle3'",
    ),
    (
        {"method": "dflash", "k": 7, "drafter": "d", "adaptive_verification": True},
        "enable_adaptive_verification is only supported by method 'dspark', got method='dflash'",
    ),
    (
        {"method": "eagle3", "k": 5, "drafter": "d", "k_per_batch_size": [[0, 16, 5]]},
        "num_speculative_tokens_per_batch_size entry [0, 16, 5] needs 1 <= lo <= hi",
    ),
    (
        {"method": "eagle3", "k": 5, "drafter": "d", "k_per_batch_size": [[17, 16, 4]]},
        "num_speculative_tokens_per_batch_size entry [17, 16, 4] needs 1 <= lo <= hi",
    ),
    (
        {"method": "eagle3", "k": 5, "drafter": "d", "k_per_batch_size": [[1, 16, 6]]},
        "entry [1, 16, 6] needs 0 <= k <= num_speculative_tokens=5",
    ),
    (
        {"method": "dflash", "k": 5, "drafter": "d", "k_per_batch_size": [[1, 16, -1]]},
        "entry [1, 16, -1] needs 0 <= k <= num_speculative_tokens=5",
    ),
    (
        {"method": "eagle3", "k": 5, "drafter": "d", "k_per_batch_size": [[1, 16, 5], [16, 32, 4]]},
        "entry [16, 32, 4] overlaps or is out of order (previous hi=16)",
    ),
    (
        {"method": "eagle3", "k": 5, "drafter": "d", "k_per_batch_size": [[17, 32, 4], [1, 16, 5]]},
        "entry [1, 16, 5] overlaps or is out of order (previous hi=32)",
    ),
    (
        {"method": "eagle3", "k": 5, "drafter": "d", "k_per_batch_size": []},
        "num_speculative_tokens_per_batch_size must not be empty for method 'eagle3'",
    ),
    (
        {"method": "eagle3", "k": 5, "drafter": "d", "k_per_batch_size": [[1, 16]]},
        "num_speculative_tokens_per_batch_size entries must be [lo, hi, k], got [1, 16]",
    ),
    (
        {"method": "eagle3", "k": 5, "drafter": "d", "k_per_batch_size": [[1, 16, 2.5]]},
        "entries must be [lo, hi, k] ints, got [1, 16, 2.5]",
    ),
    (
        {"method": "mtp", "k_per_batch_size": [[1, 16, 1]]},
        "num_speculative_tokens_per_batch_size needs num_speculative_tokens for method 'mtp' "
        "(k=None)",
    ),
    *[
        (
            {"method": "dspark", "k": 7, "extra": {key: 1}},
            f"extra key '{key}' would override a key draftgate renders",
        )
        for key in (
            "method",
            "model",
            "num_speculative_tokens",
            "parallel_drafting",
            "num_speculative_tokens_per_batch_size",
            "enable_adaptive_verification",
        )
    ],
    (
        {"method": "ngram", "k": 4, "extra": {"prompt_lookup_max": {1, 2}}},
        "extra key 'prompt_lookup_max' is not JSON-serialisable: {1, 2}",
    ),
    (
        {"method": "dspark", "k": 7, "extra": {"synthetic_acceptance_length": float("nan")}},
        "extra key 'synthetic_acceptance_length' is not JSON-serialisable: nan",
    ),
]


@pytest.mark.parametrize(("kwargs", "message"), INVALID_SPECS)
def test_invalid_spec_is_rejected_with_the_offending_values(
    kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidMethodSpec, match=re.escape(message)):
        make_spec(**kwargs)


@pytest.mark.parametrize(
    "spec",
    [
        MethodSpec(method="peagle", k=7, drafter="d"),
        MethodSpec(method="eagle3", k=0, drafter="d"),
        MethodSpec(method="dflash", k=7),
        MethodSpec(method="eagle3", k=3, drafter="d", k_per_batch_size=((1, 8, 4),)),
        MethodSpec(method="ngram", k=4, extra={"method": "suffix"}),
    ],
)
def test_render_validates_hand_built_specs(spec: MethodSpec) -> None:
    with pytest.raises(InvalidMethodSpec):
        validate_spec(spec)
    with pytest.raises(InvalidMethodSpec):
        render_speculative_config(spec)
    with pytest.raises(InvalidMethodSpec):
        render_vllm_args("m", spec)


def test_invalid_method_spec_is_a_value_error() -> None:
    assert issubclass(InvalidMethodSpec, ValueError)


def test_unknown_method_lists_every_known_method() -> None:
    known = ", ".join(METHOD_IDS)
    with pytest.raises(
        InvalidMethodSpec, match=re.escape(f"unknown method 'peagle'; known: {known}")
    ):
        method_info("peagle")


def test_plain_k_zero_is_normalised() -> None:
    assert make_spec("plain", 0) == MethodSpec(method="plain")


def test_make_spec_normalises_schedule_and_copies_extra() -> None:
    extra: dict[str, object] = {"attention_backend": "FLASH_ATTN"}
    spec = make_spec("dflash", 7, "d", k_per_batch_size=[[1, 8, 7], [9, 64, 3]], extra=extra)
    extra["attention_backend"] = "TRITON_ATTN"
    assert spec.k_per_batch_size == ((1, 8, 7), (9, 64, 3))
    assert spec.extra == {"attention_backend": "FLASH_ATTN"}
    with pytest.raises(TypeError):
        spec.extra["x"] = 1  # type: ignore[index]


def test_specs_are_frozen_and_hashable() -> None:
    spec = make_spec("eagle3", 3, "d", extra={"draft_sample_method": "greedy"})
    assert hash(spec) == hash(make_spec("eagle3", 3, "d", extra={"draft_sample_method": "greedy"}))
    with pytest.raises(AttributeError):
        spec.k = 4  # type: ignore[misc]


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({}, {"method": "dspark", "num_speculative_tokens": 7}),
        (
            {"enable_adaptive_verification": True, "draft_sample_method": "probabilistic"},
            {
                "method": "dspark",
                "num_speculative_tokens": 7,
                "enable_adaptive_verification": True,
                "draft_sample_method": "probabilistic",
            },
        ),
        (
            {"num_speculative_tokens_per_batch_size": [[1, 32, 7], [33, 128, 5]]},
            {
                "method": "dspark",
                "num_speculative_tokens": 7,
                "num_speculative_tokens_per_batch_size": [[1, 32, 7], [33, 128, 5]],
            },
        ),
    ],
)
def test_spec_from_options_renders_the_options(
    options: dict[str, object], expected: dict[str, object]
) -> None:
    spec = spec_from_options("dspark", 7, None, options)
    assert render_speculative_config(spec) == expected


@pytest.mark.parametrize(
    ("options", "match"),
    [
        (
            {"num_speculative_tokens_per_batch_size": "1-32:7"},
            r"list of \[lo, hi, k\], got '1-32:7'",
        ),
        ({"num_speculative_tokens_per_batch_size": [[1, 2, "x"]]}, r"got \[\[1, 2, 'x'\]\]"),
        ({"enable_adaptive_verification": "yes"}, r"must be a boolean, got 'yes'"),
    ],
)
def test_spec_from_options_rejects_wrong_shapes(options: dict[str, object], match: str) -> None:
    with pytest.raises(InvalidMethodSpec, match=match):
        spec_from_options("dspark", 7, None, options)
