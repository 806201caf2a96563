"""Pool discovery: each pool's DNS name resolved on an interval, its addresses kept as
member backends.

Every gateway replica's leader does this; where two add or remove the same member, the
first does it (and audits it) and the other finds it done.

An address that appears becomes a member once its `/health` answers (so a pod still
loading its model takes no traffic); an address gone is removed, audited: no new request
goes to it and the streams in flight on it finish (a backend's state outlives its row).
A resolution that fails, or answers no address at all, keeps the members last seen and
says so (`draftgate_pool_discovery_ok` 0 and a warning): a DNS outage or a typo never
empties a pool; members whose pods are gone fail their health probes instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import httpx
from prometheus_client import Gauge
from sqlalchemy.orm import Session, sessionmaker

from backends.probe import Probe, probe_health
from gateway.control.dns import DnsError, Resolver
from gateway.db.session import transaction
from gateway.errors import Conflict, NotFound, ValidationFailed
from gateway.schemas.resources import PoolCreate
from gateway.services import pools

logger = logging.getLogger(__name__)
ACTOR = "discovery"
T = TypeVar("T")


@dataclass
class Discovery:
    """Keeps every pool's members in step with its DNS name."""

    sessions: sessionmaker[Session]
    client: httpx.AsyncClient
    resolver: Resolver
    interval_s: float
    ok: Gauge  # draftgate_pool_discovery_ok{pool}
    allow_link_local: bool = False
    on_change: Callable[[], None] = lambda: None  # the registry's refresh
    failing: dict[str, str] = field(default_factory=dict)  # pool -> why its last round failed
    seen: set[str] = field(default_factory=set)  # pools resolved since this leader began

    async def run(self, stop: asyncio.Event) -> None:
        """A round at once, then one per interval, until `stop`."""
        while not stop.is_set():
            try:
                await self.round()
            except Exception:  # one bad round is logged, never the end of discovery
                logger.exception("pool discovery round failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval_s)

    async def round(self) -> None:
        """Resolve every pool once and apply what changed."""
        declared = await asyncio.to_thread(self._read, pools.pools)
        for name in set(self.failing) - {p.name for p in declared}:
            del self.failing[name]
        changed = await asyncio.gather(*(self._follow(pool) for pool in declared))
        if any(changed):
            self.on_change()

    async def _follow(self, pool: PoolCreate) -> bool:
        """One pool's round; whether its members changed."""
        try:
            resolution = await self.resolver.resolve(pool.discovery.dns)
            if not resolution.addresses:
                raise DnsError(f"{pool.discovery.dns} has no address")
        except DnsError as exc:
            await self._failed(pool.name, str(exc))
            return False
        if self.failing.pop(pool.name, None) is not None or pool.name not in self.seen:
            await asyncio.to_thread(
                self._write, lambda s: pools.set_discovery_error(s, pool.name, None)
            )
        self.seen.add(pool.name)
        self.ok.labels(pool.name).set(1)
        found = resolution.addresses
        held = await asyncio.to_thread(self._read, lambda s: _addresses(s, pool))
        new = sorted(found - set(held.values()))
        healthy = await asyncio.gather(*(self._healthy(pool, a) for a in new))
        joining = [a for a, ok in zip(new, healthy, strict=True) if ok]
        # A partial answer adds members but never removes one: the record type that
        # failed may hold them.
        leaving = (
            []
            if resolution.errors
            else sorted(name for name, address in held.items() if address not in found)
        )
        if joining or leaving:
            await asyncio.to_thread(self._apply, pool, joining, leaving)
        return bool(joining or leaving)

    async def _failed(self, pool: str, why: str) -> None:
        """Keep the members; say why, once per new reason (log, the pool's row for /ready)."""
        if self.failing.get(pool) != why:
            logger.warning("pool %s: discovery failed, keeping its members: %s", pool, why)
            await asyncio.to_thread(self._write, lambda s: pools.set_discovery_error(s, pool, why))
        self.failing[pool] = why
        self.ok.labels(pool).set(0)

    def _write(self, write: Callable[[Session], None]) -> None:
        with transaction(self.sessions) as session:
            write(session)

    async def _healthy(self, pool: PoolCreate, address: str) -> bool:
        member = pool.member(address)
        auth = {"Authorization": f"Bearer {member.api_key}"} if member.api_key else {}
        probe = await probe_health(self.client, member.normalised_url(), 2.0, auth)
        return probe is Probe.HEALTHY

    def _read(self, read: Callable[[Session], T]) -> T:
        with self.sessions() as session:
            return read(session)

    def _apply(self, pool: PoolCreate, joining: list[str], leaving: list[str]) -> None:
        with transaction(self.sessions) as session:
            for address in joining:
                try:
                    pools.add_member(
                        session, pool, address, ACTOR, allow_link_local=self.allow_link_local
                    )
                except ValidationFailed as exc:  # a link-local address
                    logger.warning("pool %s: %s not added: %s", pool.name, address, exc)
                except Conflict:
                    pass  # another gateway replica's discovery added it first
            for name in leaving:
                with contextlib.suppress(NotFound):  # or removed it first
                    pools.remove_member(session, name, ACTOR)
        for address in joining:
            logger.info("pool %s: %s joined", pool.name, address)
        for name in leaving:
            logger.info(
                "pool %s: %s left (drained: its requests in flight finish)", pool.name, name
            )


def _addresses(session: Session, pool: PoolCreate) -> dict[str, str]:
    """Each member's name and the address it serves at."""
    prefix, suffix = f"{pool.name}:", f":{pool.discovery.port}"
    return {
        row.name: row.name.removeprefix(prefix).removesuffix(suffix)
        for row in pools.members(session, pool.name)
    }
