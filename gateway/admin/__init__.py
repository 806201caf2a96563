"""The control plane: `/admin/v1`, one module per resource, all behind the admin token."""

from fastapi import APIRouter, Depends

from gateway.admin import audit, backends, keys, models, prices
from gateway.deps import require_admin


def admin_router() -> APIRouter:
    """Every admin resource under `/admin/v1`, behind the admin token."""
    router = APIRouter(prefix="/admin/v1", dependencies=[Depends(require_admin)])
    for module in (backends, models, prices, keys, audit):
        router.include_router(module.router)
    return router
