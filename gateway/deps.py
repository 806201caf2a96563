"""FastAPI dependencies: the app's components, a transaction per request, admin auth."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from ipaddress import IPv4Network, IPv6Network, ip_address
from typing import Annotated, Literal

import httpx
from fastapi import Depends, Request
from pydantic import SecretStr
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from gateway.control.managed import ManagedBackends
from gateway.db.session import transaction
from gateway.errors import AuthenticationFailed, InsufficientScope, InvalidRequest, UntrustedProxy
from gateway.homes import ResponseHomes
from gateway.metrics import GatewayMetrics
from gateway.registry import Registry
from gateway.server.replica import Changes
from gateway.settings import Settings

logger = logging.getLogger(__name__)

Scope = Literal["read", "admin"]
# A route that changes nothing though it is not a GET says so in its OpenAPI entry, and a
# read token may call it: `@router.post(..., openapi_extra=READ_ONLY)`.
SCOPE_FIELD = "x-draftgate-scope"
READ_ONLY = {SCOPE_FIELD: "read"}
VIA = " via "  # an audited change a login proxy named: `<person> via <token name>`
ACTOR_CHARS = 64  # audit_log.actor's length


@dataclass(frozen=True)
class Components:
    """What the lifespan builds once and every request shares."""

    settings: Settings
    engine: Engine
    sessions: sessionmaker[Session]
    registry: Registry
    metrics: GatewayMetrics
    managed: ManagedBackends
    changes: Changes | None = None  # with worker processes: tells the others of a change
    homes: ResponseHomes | None = None  # where each stored response lives (the relay's)
    control: httpx.AsyncClient | None = None  # to backends, off the relay's connections


def get_components(request: Request) -> Components:
    """The components the lifespan attached to the app."""
    components: Components = request.app.state.components
    return components


ComponentsDep = Annotated[Components, Depends(get_components)]


def get_session(components: ComponentsDep) -> Iterator[Session]:
    """One transaction per request, committed before the response is sent."""
    with transaction(components.sessions) as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session, scope="function")]


@dataclass(frozen=True)
class Caller:
    """Who makes an admin request: its token's scope, and the name its changes are audited
    under (the token's name, or the person a trusted login proxy named, via that token)."""

    scope: Scope
    actor: str


def token_scope(settings: Settings, authorization: str | None) -> tuple[Scope, str]:
    """The scope and name of the bearer token in `authorization`: the admin token's or the
    read token's; anything else is a 401."""
    if not authorization:
        raise AuthenticationFailed("missing admin token: send 'Authorization: Bearer <token>'")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or settings.admin_token is None:
        raise AuthenticationFailed("admin API expects 'Authorization: Bearer <token>'")
    given = token.strip().encode()
    found: tuple[Scope, str] | None = None
    tokens: tuple[tuple[Scope, str, SecretStr | None], ...] = (
        ("admin", settings.admin_token_name, settings.admin_token),
        ("read", settings.admin_read_token_name, settings.admin_read_token),
    )
    for scope, name, secret in tokens:
        # every token is compared, so the time taken does not say which one nearly matched
        if secret is not None and secrets.compare_digest(given, secret.get_secret_value().encode()):
            found = found or (scope, name)
    if found is None:
        raise AuthenticationFailed("invalid admin token")
    return found


def proxied_person(request: Request, settings: Settings, token_name: str) -> str | None:
    """The signed-in person a login proxy names in `admin_user_header` (None: the header is
    off or not sent); a 403 when it comes from an address not in `admin_trusted_proxies`,
    so a header anyone can send never names anyone."""
    header = settings.admin_user_header.strip()
    value = request.headers.get(header) if header else None
    if value is None:
        return None
    peer = request.client.host if request.client is not None else ""
    if not trusted(peer, settings.trusted_proxies):
        raise UntrustedProxy(
            f"the {header} header is accepted only from the addresses in "
            f"DRAFTGATE_ADMIN_TRUSTED_PROXIES; {peer or 'this caller'} is not one of them"
        )
    person = value.strip()
    room = ACTOR_CHARS - len(VIA) - len(token_name)
    if not person or len(person) > room or not person.isprintable():
        raise InvalidRequest(
            f"the {header} header must name a person in 1 to {room} printable characters",
            param=header,
            code="invalid_admin_user",
        )
    return person


def trusted(peer: str, networks: tuple[IPv4Network | IPv6Network, ...]) -> bool:
    """Whether the address `peer` lies in one of `networks`."""
    try:
        address = ip_address(peer)
    except ValueError:
        return False
    return any(address in network for network in networks)


def required_scope(request: Request) -> Scope:
    """`read` for a GET or HEAD and for a route marked `READ_ONLY`; `admin` for the rest."""
    if request.method in ("GET", "HEAD"):
        return "read"
    extra = getattr(request.scope.get("route"), "openapi_extra", None) or {}
    return "read" if extra.get(SCOPE_FIELD) == "read" else "admin"


def authorize_admin(request: Request) -> Caller:
    """Check the request's admin token against what its route needs, and the person a login
    proxy names, if any: who the caller is."""
    settings = get_components(request).settings
    scope, name = token_scope(settings, request.headers.get("authorization"))
    if scope == "read" and required_scope(request) == "admin":
        raise InsufficientScope("this token may only read; changes need the admin token")
    person = proxied_person(request, settings, name)
    return Caller(scope, name if person is None else f"{person}{VIA}{name}")


CallerDep = Annotated[Caller, Depends(authorize_admin)]


def admin_actor(caller: CallerDep) -> str:
    """The name the audit log gives the request's changes."""
    return caller.actor


ActorDep = Annotated[str, Depends(admin_actor)]


def refresh_registry_after_changes(request: Request, components: ComponentsDep) -> Iterator[None]:
    """After an admin change is committed, reload the registry before answering.

    So the next request through this replica already follows the change, whichever of its
    worker processes serves it (other replicas follow within their `registry_refresh_s`).
    Used with scope="function": it runs after the request's transaction commits, before the
    response is sent.
    """
    yield
    if request.method in ("GET", "HEAD"):
        return
    try:
        components.registry.load()
    except SQLAlchemyError as exc:  # the change is committed; the refresh loop retries
        logger.warning("registry not reloaded after an admin change: %s", exc)
        components.registry.request_refresh()
    if components.changes is not None:
        components.changes.announce_and_wait()
