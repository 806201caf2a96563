"""docker compose services for vLLM backends, with the same arguments as `render_vllm_args`.

The dashboard's planner and the compose file's `gpu` profile both come from here, so a
service copied from either serves exactly the `--speculative-config` the catalog renders.
"""

from __future__ import annotations

from collections.abc import Sequence

from backends.methods import VLLM_VERSION, MethodSpec, render_vllm_args

VLLM_IMAGE = f"vllm/vllm-openai:v{VLLM_VERSION}"
VLLM_PORT = 8000
# Where the vLLM image keeps Hugging Face downloads: a named volume keeps them across restarts.
HF_CACHE_PATH = "/root/.cache/huggingface"
HEALTH_START_PERIOD = "900s"  # weights download and CUDA graph capture take minutes


def vllm_healthcheck(port: int = VLLM_PORT) -> dict[str, object]:
    """A compose healthcheck on vLLM's `GET /health` (Python is in every vLLM image)."""
    url = f"http://127.0.0.1:{port}/health"
    probe = f"import urllib.request; urllib.request.urlopen('{url}', timeout=5)"
    return {
        "test": ["CMD", "python3", "-c", probe],
        "interval": "15s",
        "timeout": "10s",
        "retries": 3,
        "start_period": HEALTH_START_PERIOD,
    }


def gpu_device_ids(first_gpu: int, gpu_count: int) -> list[str]:
    """The host's GPU indices a service gets: `gpu_count` of them from `first_gpu`."""
    return [str(i) for i in range(first_gpu, first_gpu + gpu_count)]


def gpu_reservation(gpu_count: int, first_gpu: int = 0) -> dict[str, object]:
    """`deploy:` reserving these GPUs by index for one service. By index, not `count:`:
    Docker gives every `count: 1` service the same first GPU, so a second vLLM on the
    host would start on a GPU the first already fills."""
    device = {
        "driver": "nvidia",
        "device_ids": gpu_device_ids(first_gpu, gpu_count),
        "capabilities": ["gpu"],
    }
    return {"resources": {"reservations": {"devices": [device]}}}


def vllm_command(
    model: str,
    spec: MethodSpec,
    *,
    port: int = VLLM_PORT,
    extra_args: Sequence[str] = (),
    scheduling: str = "fcfs",
) -> list[str]:
    """The service's `command:`, the arguments of the image's entrypoint `vllm serve`."""
    host = "0.0.0.0"  # noqa: S104  (inside the container; compose decides what is published)
    argv = render_vllm_args(
        model, spec, host=host, port=port, extra_args=extra_args, scheduling=scheduling
    )
    return argv[2:]


def vllm_service(
    model: str,
    spec: MethodSpec,
    *,
    port: int = VLLM_PORT,
    gpu_count: int = 1,
    first_gpu: int = 0,
    hf_cache_volume: str = "hf-cache",
    image: str = VLLM_IMAGE,
    extra_args: Sequence[str] = (),
) -> dict[str, object]:
    """One compose service running `vllm serve` for `model` with `spec` on `gpu_count` GPUs,
    host GPUs `first_gpu` onwards."""
    return {
        "image": image,
        "command": vllm_command(model, spec, port=port, extra_args=extra_args),
        "environment": {"HF_TOKEN": "${HF_TOKEN:-}"},
        "volumes": [f"{hf_cache_volume}:{HF_CACHE_PATH}"],
        "ipc": "host",
        "deploy": gpu_reservation(gpu_count, first_gpu),
        "healthcheck": vllm_healthcheck(port),
    }
