"""The control plane: `/admin/v1`, one module per resource, all behind the admin token."""

from fastapi import APIRouter, Depends

from gateway.admin import (
    audit,
    backends,
    benchmarks,
    curves,
    fleet,
    gpus,
    keys,
    lossless,
    measurements,
    methods,
    models,
    plan,
    pools,
    prices,
    savings,
    spend,
    switches,
    teams,
    usage,
    whoami,
)
from gateway.deps import authorize_admin, refresh_registry_after_changes
from gateway.errors import ADMIN_ERROR_RESPONSES


def admin_router() -> APIRouter:
    """Every admin resource under `/admin/v1`, behind the admin token (reads also behind the
    read token)."""
    dependencies = [
        Depends(refresh_registry_after_changes, scope="function"),
        Depends(authorize_admin),
    ]
    router = APIRouter(
        prefix="/admin/v1", dependencies=dependencies, responses=ADMIN_ERROR_RESPONSES
    )
    for module in (
        backends,
        switches,
        fleet,
        models,
        prices,
        pools,
        keys,
        teams,
        audit,
        plan,
        savings,
        benchmarks,
        spend,
        curves,
        gpus,
        measurements,
        methods,
        usage,
        lossless,
        whoami,
    ):
        router.include_router(module.router)
    router.include_router(plan.accuracy_router)
    return router
