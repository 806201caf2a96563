"""Admin API for decoding methods: the catalog, and a spec rendered as vLLM would run it."""

from __future__ import annotations

from fastapi import APIRouter

from backends.methods import MethodInfo
from gateway.deps import READ_ONLY
from gateway.schemas.methods import ComposeService, MethodPublic, MethodRender, MethodRendering
from gateway.schemas.resources import ListOf
from gateway.services import methods

router = APIRouter(prefix="/methods", tags=["methods"])


def _method(info: MethodInfo) -> MethodPublic:
    return MethodPublic(
        id=info.id,
        description=info.description,
        speculative=info.speculative,
        vllm_method=info.vllm_method,
        parallel=info.parallel,
        k_required=info.speculative and not info.k_optional,
        drafter_required=info.drafter_required,
        drafter_allowed=info.drafter_allowed,
        adaptive_verification=info.supports_adaptive_verification,
    )


@router.get("")
def list_methods() -> ListOf[MethodPublic]:
    """Every decoding method a backend may declare, in catalog order, with what it needs."""
    return ListOf[MethodPublic](data=[_method(info) for info in methods.catalog()])


@router.post("/render", openapi_extra=READ_ONLY)
def render_method(request: MethodRender) -> MethodRendering:
    """A method spec as `vllm serve` arguments and a docker compose file; changes nothing."""
    spec = request.method_spec()
    deployment = methods.render_deployment(
        request.model,
        spec,
        gpu_count=request.gpu_count,
        first_gpu=request.first_gpu,
        port=request.port,
    )
    return MethodRendering(
        model=request.model,
        method=spec.method,
        k=spec.k,
        drafter=spec.drafter,
        speculative_config=deployment.speculative_config,
        argv=deployment.argv,
        command=deployment.command,
        compose_service=ComposeService.model_validate(deployment.compose_service),
        compose_yaml=deployment.compose_yaml,
    )
