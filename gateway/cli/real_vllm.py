"""`draftgate up --real-vllm`: real vLLM servers for a tiny local model instead of simulators.

The tiny target and its random drafters are built locally (no hub); each requested method
gets a `vllm serve` on consecutive ports, registered as a managed backend, so the control
plane can also switch it (start another `vllm serve`, shift traffic, stop the old one).
Random drafters accept nothing; `ngram` and `draft_model` with the target drafting for
itself accept a lot at temperature 0, which is what makes the counters move.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from backends.launcher import LocalServer, vllm_argv, vllm_env
from backends.tiny_models import TinyModels, build_tiny_models, tiny_model_paths
from gateway.cli.stack import REAL_VLLM_MODEL
from gateway.control.managed import Launch
from gateway.schemas.resources import BackendCreate
from gateway.services.fleet import Fleet, apply_fleet

MODEL = REAL_VLLM_MODEL
GPU = "cpu"  # not in the GPU catalog: measured, never priced
DEFAULT_METHODS = ("plain", "ngram", "p-eagle", "dflash")
START_TIMEOUT_S = 420.0  # several servers importing torch at once on a small machine


def backend_fields(method: str, models: TinyModels) -> dict[str, Any]:
    """How each method serves the tiny target: K, drafter and extra speculative options."""
    fields: dict[str, dict[str, Any]] = {
        "plain": {},
        "ngram": {"k": 4, "speculative_options": {"prompt_lookup_max": 4}},
        "draft_model": {"k": 3, "drafter": str(models.target)},  # the target drafts itself
        "eagle3": {"k": 3, "drafter": str(models.eagle3)},
        "p-eagle": {"k": 3, "drafter": str(models.peagle)},
        "dflash": {"k": 3, "drafter": str(models.dflash)},
    }
    if method not in fields:
        raise ValueError(f"no tiny drafter for {method!r}; choose from {', '.join(fields)}")
    return fields[method]


def real_backends(
    methods: Sequence[str], base_port: int, models: TinyModels
) -> list[BackendCreate]:
    """One managed backend per method on consecutive ports."""
    return [
        BackendCreate.model_validate(
            {
                "name": f"real-{method}",
                "url": f"http://127.0.0.1:{base_port + i}",
                "model": MODEL,
                "method": method,
                "gpu_type": GPU,
                "managed": True,
                **backend_fields(method, models),
            }
        )
        for i, method in enumerate(methods)
    ]


def prepare(model_dir: Path) -> TinyModels:
    """The tiny models, built once into `model_dir`."""
    models = tiny_model_paths(model_dir)
    if all((path / "config.json").is_file() for path in vars(models).values()):
        return models
    return build_tiny_models(model_dir)


def seed(session: Session, backends: Sequence[BackendCreate]) -> None:
    """Register the real backends."""
    apply_fleet(session, Fleet(backends=list(backends)))


def vllm_launcher(vllm_python: Path | None, target: Path) -> Launch:
    """How a managed real backend starts: `vllm serve` of the tiny target with its method."""

    def launch(backend: BackendCreate, port: int, log_path: Path) -> LocalServer:
        argv = vllm_argv(
            str(target),
            backend.method_spec(),
            port,
            vllm_python=vllm_python,
            served_model_name=backend.model,
            scheduling=backend.scheduling,
        )
        return LocalServer(backend.name, argv, port, log_path, env=vllm_env(vllm_python))

    return launch


def start(backends: Sequence[BackendCreate], launch: Launch, log_dir: Path) -> list[LocalServer]:
    """Start every real backend at once and wait until all are healthy."""
    servers = [launch(b, _port(b), log_dir / f"{b.name}.log") for b in backends]
    try:
        for server in servers:
            server.start()
        for server in servers:
            server.wait_healthy(START_TIMEOUT_S)
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return servers


def _port(backend: BackendCreate) -> int:
    port = backend.url.port
    assert port is not None
    return port
