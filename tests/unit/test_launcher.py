"""Rendering a real vLLM server's command line and environment (no process started)."""

from __future__ import annotations

import json
from pathlib import Path

from backends.launcher import (
    CPU_SERVE_ARGS,
    OFFLINE_ENV,
    PER_REQUEST_SPEC_ARGS,
    vllm_argv,
    vllm_env,
)
from backends.methods import make_spec, render_vllm_args


def test_vllm_argv_is_the_catalogs_rendering_with_the_cpu_flags() -> None:
    spec = make_spec("p-eagle", 3, "/models/peagle")
    argv = vllm_argv("/models/target", spec, 18000, served_model_name="tiny")
    assert argv == [
        *render_vllm_args(
            "/models/target", spec, port=18000, host="127.0.0.1", served_model_name="tiny"
        ),
        *CPU_SERVE_ARGS,
        *PER_REQUEST_SPEC_ARGS,  # a speculative server reports each request's drafts
    ]
    config = json.loads(argv[argv.index("--speculative-config") + 1])
    assert config == {
        "method": "eagle3",
        "model": "/models/peagle",
        "num_speculative_tokens": 3,
        "parallel_drafting": True,
    }
    assert argv[argv.index("--kv-cache-memory-bytes") + 1] == "64M"
    assert "--enforce-eager" in argv


def test_vllm_argv_runs_the_vllm_beside_the_configured_interpreter() -> None:
    argv = vllm_argv(
        "m",
        make_spec("plain"),
        1234,
        vllm_python=Path("/venvs/vllm/bin/python"),
        extra_args=("--max-num-seqs", "4"),
    )
    assert argv[:3] == ["/venvs/vllm/bin/vllm", "serve", "m"]
    assert argv[-2:] == ["--max-num-seqs", "4"]
    assert "--speculative-config" not in argv
    assert "--per-request-spec-decode-metrics" not in argv  # nothing to report
    assert vllm_argv("m", make_spec("plain"), 1234)[0] == "vllm"


def test_vllm_env_serves_offline_and_preloads_intel_openmp(tmp_path: Path) -> None:
    python = tmp_path / "bin" / "python"
    # No libiomp5 in this virtualenv; threads unpinned so servers can share the cores.
    assert vllm_env(python) == OFFLINE_ENV | {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libiomp5.so").write_bytes(b"")
    env = vllm_env(python)
    assert env["LD_PRELOAD"] == str(tmp_path / "lib" / "libiomp5.so")
    assert env["HF_HUB_OFFLINE"] == env["TRANSFORMERS_OFFLINE"] == "1"
