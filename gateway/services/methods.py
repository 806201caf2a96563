"""The decoding-method catalog, and a method spec rendered as `vllm serve` and a compose file."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

import yaml

from backends.compose import VLLM_PORT, vllm_service
from backends.methods import (
    METHODS,
    MethodInfo,
    MethodSpec,
    render_speculative_config,
    render_vllm_args,
)

SERVICE_NAME = "vllm"
HF_CACHE_VOLUME = "hf-cache"
# Inside the container vLLM listens on every interface; compose decides what is published.
CONTAINER_HOST = "0.0.0.0"  # noqa: S104
# Published on loopback only: vLLM has no authentication, the gateway sits in front of it.
PUBLISH_HOST = "127.0.0.1"


@dataclass(frozen=True, slots=True)
class Deployment:
    """One backend's vLLM configuration: `vllm serve` argv and a compose service and file."""

    speculative_config: dict[str, object] | None
    argv: list[str]
    command: str
    compose_service: dict[str, object]
    compose_yaml: str


def catalog() -> list[MethodInfo]:
    """Every decoding method draftgate knows, in catalog order."""
    return list(METHODS.values())


def render_deployment(
    model: str,
    spec: MethodSpec,
    *,
    gpu_count: int = 1,
    first_gpu: int = 0,
    port: int = VLLM_PORT,
) -> Deployment:
    """`vllm serve` for `model` with `spec`, and a compose file running it on `gpu_count` GPUs
    from host GPU `first_gpu`."""
    argv = render_vllm_args(model, spec, host=CONTAINER_HOST, port=port)
    service = vllm_service(
        model,
        spec,
        port=port,
        gpu_count=gpu_count,
        first_gpu=first_gpu,
        hf_cache_volume=HF_CACHE_VOLUME,
    )
    service["ports"] = [f"{PUBLISH_HOST}:{port}:{port}"]
    compose = {"services": {SERVICE_NAME: service}, "volumes": {HF_CACHE_VOLUME: {}}}
    return Deployment(
        speculative_config=render_speculative_config(spec),
        argv=argv,
        command=shlex.join(argv),
        compose_service=service,
        compose_yaml=yaml.safe_dump(compose, sort_keys=False),
    )
