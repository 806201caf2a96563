"""The backend prober: every enabled backend's `/health` on an interval, into the registry,
and once per backend the context length its `/v1/models` reports."""

from __future__ import annotations

import asyncio
import logging
import time

import httpx

from backends.probe import Probe, probe_health, probe_max_model_len
from gateway.events.webhooks import WebhookSender, backend_health
from gateway.metrics import GatewayMetrics, forget_backends
from gateway.registry import BackendState, Registry

logger = logging.getLogger(__name__)
SLOW_PROBES_DOWN = 2  # a server too busy to answer /health once is not yet taken out


async def probe_forever(
    registry: Registry,
    client: httpx.AsyncClient,
    interval_s: float,
    metrics: GatewayMetrics,
    webhooks: WebhookSender | None = None,
) -> None:
    """Probe every enabled backend's `/health` on an interval; publish health gauges (and
    send `backend.down` / `backend.up` when a backend's health changes)."""
    while True:
        backends = [b for group in registry.snapshot.backends.values() for b in group]
        # One backend's probe failing in a way nobody foresaw is that backend down, never
        # the end of every backend's health checks.
        results = await asyncio.gather(
            *(probe_health(client, b.url, min(interval_s, 2.0), b.auth()) for b in backends),
            return_exceptions=True,
        )
        now = time.monotonic()
        for backend, result in zip(backends, results, strict=True):
            state = registry.states[backend.name]
            if isinstance(result, BaseException):
                logger.warning("probe of %s failed: %r", backend.name, result)
            probe = result if isinstance(result, Probe) else Probe.DOWN
            was_healthy = state.healthy
            apply_probe(state, probe)
            if webhooks is not None and state.healthy != was_healthy:
                webhooks.emit(backend_health(backend, state.healthy, probe.value))
            up = int(state.healthy and state.open_until <= now)
            metrics.healthy.labels(backend.name, backend.pool).set(up)
            metrics.in_flight.labels(backend.name, backend.pool).set(state.in_flight)
        forget_backends(metrics, {b.name for b in backends})
        unknown = [
            b for b in backends if registry.states[b.name].max_model_len is None
            and registry.states[b.name].healthy
        ]  # fmt: skip
        lengths = await asyncio.gather(
            *(
                probe_max_model_len(client, b.url, b.model, min(interval_s, 2.0), b.auth())
                for b in unknown
            ),
            return_exceptions=True,
        )
        for backend, length in zip(unknown, lengths, strict=True):
            if not isinstance(length, BaseException):
                registry.states[backend.name].max_model_len = length
        await asyncio.sleep(interval_s)


def apply_probe(state: BackendState, result: Probe) -> None:
    """A refusal takes a backend out at once; silence only `SLOW_PROBES_DOWN` times running."""
    state.slow_probes = state.slow_probes + 1 if result is Probe.SLOW else 0
    if result is Probe.HEALTHY:
        state.healthy = True
    elif result is Probe.DOWN or state.slow_probes >= SLOW_PROBES_DOWN:
        state.healthy = False
