"""Admin API for the GPU catalog: every GPU type the planner knows, with its default prices."""

from __future__ import annotations

from fastapi import APIRouter

from gateway.schemas.resources import GpuDefaultPrice, GpuPublic, ListOf
from planner import catalog

router = APIRouter(prefix="/gpus", tags=["gpus"])


def _gpu(gpu: catalog.GpuSpec, prices: tuple[catalog.GpuPriceSpec, ...]) -> GpuPublic:
    shipped = [
        GpuDefaultPrice(
            kind=p.kind, usd_per_gpu_hour=p.usd_per_gpu_hour, source=p.source, date=p.date
        )
        for p in prices
        if p.gpu_type == gpu.name
    ]
    return GpuPublic(
        name=gpu.name,
        aliases=list(gpu.aliases),
        memory_gb=gpu.memory_gb,
        hbm_bandwidth_tb_s=gpu.hbm_bandwidth_tb_s,
        bf16_dense_tflops=gpu.bf16_dense_tflops,
        fp8_dense_tflops=gpu.fp8_dense_tflops,
        fp4_dense_tflops=gpu.fp4_dense_tflops,
        estimated=gpu.estimated,
        source=gpu.source,
        default_prices=shipped,
    )


@router.get("")
def list_gpus() -> ListOf[GpuPublic]:
    """The planner's GPU catalog in file order: a GPU added to its data file is listed here."""
    prices = catalog.default_prices()
    return ListOf[GpuPublic](data=[_gpu(gpu, prices) for gpu in catalog.gpus().values()])
