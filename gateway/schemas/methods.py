"""The method catalog and rendered vLLM deployments, as the admin API shows them."""

from __future__ import annotations

from typing import Any, Self

from pydantic import BaseModel, Field, model_validator

from backends.methods import MethodSpec, spec_from_options
from gateway.schemas.resources import Method, Name, Strict


class MethodPublic(BaseModel):
    """One decoding method of the catalog, and what a backend spec for it needs."""

    id: str
    description: str
    speculative: bool  # False only for plain decoding
    vllm_method: str | None  # `method` in vLLM's --speculative-config; None for plain
    parallel: bool  # drafts all K tokens in one pass
    k_required: bool  # K must be given; vLLM fills it in for the others (or plain takes none)
    drafter_required: bool
    drafter_allowed: bool
    adaptive_verification: bool  # accepts `enable_adaptive_verification`


class MethodRender(Strict):
    """A method spec to render as `vllm serve` arguments and a docker compose service."""

    model: Name
    method: Method
    k: int | None = None
    drafter: str | None = Field(default=None, max_length=500)
    speculative_options: dict[str, Any] = Field(default_factory=dict)
    gpu_count: int = Field(default=1, ge=1, le=1024)  # GPUs the compose service reserves
    first_gpu: int = Field(default=0, ge=0, le=1023)  # the first of them, by host index
    port: int = Field(default=8000, ge=1, le=65535)  # vLLM's port, published on loopback

    def method_spec(self) -> MethodSpec:
        """The validated method spec (raises `InvalidMethodSpec`)."""
        return spec_from_options(self.method, self.k, self.drafter, self.speculative_options)

    @model_validator(mode="after")
    def _check_method(self) -> Self:
        self.method_spec()  # InvalidMethodSpec is a ValueError naming the field at fault
        return self


class ComposeHealthcheck(BaseModel):
    """A compose healthcheck (durations as compose writes them, `15s`)."""

    test: list[str]
    interval: str
    timeout: str
    retries: int
    start_period: str


class ComposeDevice(BaseModel):
    """GPUs a compose service reserves."""

    driver: str
    device_ids: list[str]  # host GPU indices: each service its own
    capabilities: list[str]


class ComposeReservations(BaseModel):
    """`deploy.resources.reservations` of a compose service."""

    devices: list[ComposeDevice]


class ComposeResources(BaseModel):
    """`deploy.resources` of a compose service."""

    reservations: ComposeReservations


class ComposeDeploy(BaseModel):
    """`deploy` of a compose service."""

    resources: ComposeResources


class ComposeService(BaseModel):
    """A docker compose service running `vllm serve` (its `command` omits `vllm serve`)."""

    image: str
    command: list[str]
    environment: dict[str, str]
    volumes: list[str]
    ipc: str
    deploy: ComposeDeploy
    healthcheck: ComposeHealthcheck
    ports: list[str]


class MethodRendering(BaseModel):
    """A method spec as vLLM runs it: speculative config, `vllm serve` and a compose file."""

    model: str
    method: str
    k: int | None
    drafter: str | None
    speculative_config: dict[str, Any] | None
    argv: list[str]  # `vllm serve MODEL ...`, listening on every interface at `port`
    command: str  # argv shell-quoted, to copy and paste
    compose_service: ComposeService
    compose_yaml: str  # a whole compose file: the service and its Hugging Face cache volume
