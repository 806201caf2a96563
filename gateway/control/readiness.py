"""Readiness: whether this replica can serve, for `GET /ready` and the `draftgate_ready` gauge.

A replica is ready when the database answers and at least one backend passes its health
checks. A pool whose DNS discovery fails keeps its members (gateway/control/discovery.py):
it is named, with the reason, but the replica stays ready on them.

An open circuit breaker does not make a backend unhealthy here: it is the relay's
short avoidance of a backend that failed requests, and routing still falls back to it when
every breaker is open, so failing requests cannot pull every replica out of a Service at
once. Readiness follows the prober, which asks each backend itself.

The gauge is checked on the probe interval by a loop of its own, so Prometheus sees a
replica that is up but not ready even where nothing calls `/ready` (a compose stack, a
bare `draftgate gateway`).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

from prometheus_client import Gauge
from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from gateway.db.tables import Backend
from gateway.registry import Registry
from gateway.services.pools import discovery_errors


@dataclass(frozen=True)
class Readiness:
    """Whether this replica can serve: its healthy backends, and what stops it if anything."""

    healthy_backends: int
    problem: str | None = None  # None: ready
    # Pools whose last DNS resolution failed, and why: still ready on the members kept.
    discovery_errors: dict[str, str] = field(default_factory=dict)


def check_ready(sessions: sessionmaker[Session], registry: Registry) -> Readiness:
    """Ask the database and the prober's view (blocking: call from a thread)."""
    try:
        with sessions() as session:
            session.scalar(select(func.count()).select_from(Backend))
            errors = discovery_errors(session)
    except SQLAlchemyError as exc:
        return Readiness(0, f"database unreachable: {type(exc).__name__}")
    backends = [b for group in registry.snapshot.backends.values() for b in group]
    healthy = sum(registry.states[b.name].healthy for b in backends)
    if not healthy:
        return Readiness(0, f"no healthy backend ({len(backends)} enabled)", errors)
    return Readiness(healthy, None, errors)


async def publish_readiness(
    sessions: sessionmaker[Session],
    registry: Registry,
    gauge: Gauge,
    interval_s: float,
    stop: asyncio.Event,
) -> None:
    """Set `gauge` to 1 when ready, 0 when not, every `interval_s` until `stop`."""
    while not stop.is_set():
        readiness = await asyncio.to_thread(check_ready, sessions, registry)
        gauge.set(int(readiness.problem is None))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval_s)
