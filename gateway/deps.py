"""FastAPI dependencies: the app's services, a transaction per request, admin auth."""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Header, Request
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from gateway.control.benchmarks import BenchmarkManager
from gateway.control.managed import ManagedBackends
from gateway.db.session import transaction
from gateway.errors import AuthenticationFailed
from gateway.metrics import GatewayMetrics
from gateway.registry import Registry
from gateway.settings import Settings

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Services:
    """What the lifespan builds once and every request shares."""

    settings: Settings
    engine: Engine
    sessions: sessionmaker[Session]
    registry: Registry
    metrics: GatewayMetrics
    benchmarks: BenchmarkManager
    managed: ManagedBackends
    loop: asyncio.AbstractEventLoop  # for admin routes (threads) to start background work


def get_services(request: Request) -> Services:
    """The services the lifespan attached to the app."""
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


def get_session(services: ServicesDep) -> Iterator[Session]:
    """One transaction per request, committed before the response is sent."""
    with transaction(services.sessions) as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session, scope="function")]


def require_admin(
    services: ServicesDep, authorization: Annotated[str | None, Header()] = None
) -> None:
    """Accept only `Authorization: Bearer <admin token>`."""
    if not authorization:
        raise AuthenticationFailed("missing admin token: send 'Authorization: Bearer <token>'")
    scheme, _, token = authorization.partition(" ")
    expected = services.settings.admin_token
    if scheme.lower() != "bearer" or expected is None:
        raise AuthenticationFailed("admin API expects 'Authorization: Bearer <token>'")
    if not secrets.compare_digest(token.strip().encode(), expected.get_secret_value().encode()):
        raise AuthenticationFailed("invalid admin token")


def refresh_registry_after_changes(request: Request, services: ServicesDep) -> Iterator[None]:
    """After an admin change is committed, reload the registry before answering.

    So the next request through this replica already follows the change (other replicas
    follow within their `registry_refresh_s`). Used with scope="function": it runs after
    the request's transaction commits, before the response is sent.
    """
    yield
    if request.method in ("GET", "HEAD"):
        return
    try:
        services.registry.load()
    except SQLAlchemyError as exc:  # the change is committed; the refresh loop retries
        logger.warning("registry not reloaded after an admin change: %s", exc)
        services.registry.request_refresh()
