"""Pools: a backend template and where its members are found (a DNS name's addresses, or
a Kubernetes Service's ready endpoints).

Discovery (gateway/control/discovery.py) makes each address a backend named
`pool:address:port` with the pool's fields, through the same audited changes as the admin
API, so a member has its own counters, curve points, breaker and billing interval (opened
at its `create`, closed at its `delete` in the audit log).
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from gateway.db import queries
from gateway.db.sealed import seal, unseal
from gateway.db.tables import Backend, Pool
from gateway.errors import NotFound
from gateway.schemas.resources import (
    BackendUpdate,
    DnsDiscovery,
    KubernetesDiscovery,
    PoolCreate,
    PoolPublic,
    PoolTemplate,
    PoolTemplatePublic,
)
from gateway.services.backends import create_backend, delete_backend, update_backend


def pool_of(row: Pool) -> PoolCreate:
    """The pool as declared."""
    found_at = {"port": row.port, "scheme": row.scheme}
    discovery = (
        KubernetesDiscovery.model_validate(
            {**found_at, "service": row.service, "namespace": row.namespace}
        )
        if row.service is not None
        else DnsDiscovery.model_validate({**found_at, "dns": row.dns_name})
    )
    template = {**row.template, "api_key": unseal(row.template.get("api_key"))}
    return PoolCreate(name=row.name, discovery=discovery, backend=PoolTemplate(**template))


def pool_public(session: Session, row: Pool) -> PoolPublic:
    """A pool as the API shows it."""
    pool = pool_of(row)
    template = pool.backend.model_dump(exclude={"api_key"})
    return PoolPublic(
        name=row.name,
        discovery=pool.discovery,
        backend=PoolTemplatePublic(**template, has_api_key=pool.backend.api_key is not None),
        members=sorted(m.name for m in members(session, row.name)),
        discovery_error=row.discovery_error,
    )


def get_pool(session: Session, name: str) -> Pool:
    """The pool called `name` (NotFound otherwise)."""
    row = session.scalar(select(Pool).where(Pool.name == name))
    if row is None:
        raise NotFound(f"no pool named {name!r}", param="name")
    return row


def delete_pool(session: Session, name: str, actor: str) -> None:
    """Remove a pool and its members (each drained: its requests in flight finish), audited."""
    row = get_pool(session, name)
    before = _shown(pool_of(row).model_dump(mode="json"))
    for member in members(session, name):
        delete_backend(session, member.name, actor)
    session.delete(row)
    session.flush()
    queries.record_audit(
        session, actor=actor, action="delete", resource=("pool", name), before=before, after=None
    )


def apply_pool(session: Session, pool: PoolCreate, actor: str) -> Pool:
    """Create or update a pool, audited (members follow at discovery's next round)."""
    row = session.scalar(select(Pool).where(Pool.name == pool.name))
    before = None if row is None else pool_of(row).model_dump(mode="json")
    if row is None:
        row = Pool(name=pool.name)
        session.add(row)
    source = pool.discovery
    if isinstance(source, DnsDiscovery):
        row.dns_name, row.service, row.namespace = source.dns.rstrip("."), None, None
    else:
        row.dns_name, row.service, row.namespace = None, source.service, source.namespace
    row.port = pool.discovery.port
    row.scheme = pool.discovery.scheme
    template = pool.backend.model_dump(mode="json")
    row.template = {**template, "api_key": seal(pool.backend.api_key)}  # as a backend's column
    after = pool.model_dump(mode="json")
    if before is not None and before["backend"] != after["backend"]:
        for member in members(session, pool.name):  # each member becomes what the pool says
            fields = pool.member(_address(member, pool)).model_dump(exclude={"name"})
            update_backend(session, member.name, BackendUpdate.model_validate(fields), actor)
    if before != after:
        session.flush()
        queries.record_audit(
            session,
            actor=actor,
            action="create" if before is None else "update",
            resource=("pool", pool.name),
            before=_shown(before),
            after=_shown(after),
        )
    return row


def _shown(pool: dict[str, object] | None) -> dict[str, object] | None:
    """A pool as the audit log keeps it: its backend key only as whether it has one."""
    if pool is None:
        return None
    backend = dict(pool["backend"])  # type: ignore[call-overload]
    backend["has_api_key"] = backend.pop("api_key") is not None
    return {**pool, "backend": backend}


def pools(session: Session) -> list[PoolCreate]:
    """Every pool."""
    return [pool_of(row) for row in session.scalars(select(Pool).order_by(Pool.name))]


def set_discovery_error(session: Session, pool: str, error: str | None) -> None:
    """Record why `pool`'s last discovery failed (None: it found its members)."""
    row = session.scalar(select(Pool).where(Pool.name == pool))
    if row is not None:
        row.discovery_error = None if error is None else error[:500]


def discovery_errors(session: Session) -> dict[str, str]:
    """Each pool whose last resolution failed, and why."""
    rows = session.execute(select(Pool.name, Pool.discovery_error)).all()
    return {name: error for name, error in rows if error is not None}


def _address(member: Backend, pool: PoolCreate) -> str:
    """The address a member serves at, from its name (`pool:address:port`)."""
    return member.name.removeprefix(f"{pool.name}:").rpartition(":")[0]


def members(session: Session, pool: str) -> Sequence[Backend]:
    """The backends discovery made for `pool`."""
    return session.scalars(select(Backend).where(Backend.pool == pool)).all()


def add_member(
    session: Session, pool: PoolCreate, address: str, actor: str, *, allow_link_local: bool
) -> str:
    """Make the backend at `address` a member of `pool`; its name. A link-local address
    (a cloud metadata service) is refused as for any backend, unless allowed."""
    member = pool.member(address)
    create_backend(session, member, actor, allow_link_local=allow_link_local, pool=pool.name)
    return member.name


def remove_member(session: Session, name: str, actor: str) -> None:
    """Remove a member: no new requests go to it; those in flight finish."""
    delete_backend(session, name, actor)
