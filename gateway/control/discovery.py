"""Pool discovery: each pool's members kept in step with where they are found, a DNS
name's addresses (resolved on an interval) or a Kubernetes Service's ready endpoints
(watched through the API, gateway/control/kube.py: a change applies at once).

One gateway replica does this for all: the one whose leader holds the `discovery` lease
(gateway/services/leases.py). Two replicas' watches see a change at different moments, and
one whose view lags would undo what the other just did; the others read the members from
the database, and one of them takes the lease over when its holder stops (at once after a
graceful stop, after `lease_s` after a crash).

An address that appears becomes a member once its `/health` answers (so a pod still
loading its model takes no traffic); an address gone is removed, audited: no new request
goes to it and the streams in flight on it finish (a backend's state outlives its row).
A source that fails, or answers no address at all, keeps the members last seen and says
so (`draftgate_pool_discovery_ok` 0, `/ready` and a warning): a DNS or API outage, a typo
or a missing permission never empties a pool; members whose pods are gone fail their
health probes instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import httpx
from prometheus_client import Gauge
from sqlalchemy.orm import Session, sessionmaker

from backends.probe import Probe, probe_health
from gateway.control.dns import DnsError, Resolver
from gateway.control.kube import EndpointSliceWatch, ServiceAccount
from gateway.db.session import transaction
from gateway.errors import Conflict, NotFound, ValidationFailed
from gateway.schemas.resources import DnsDiscovery, KubernetesDiscovery, PoolCreate
from gateway.services import leases, pools

logger = logging.getLogger(__name__)
ACTOR = "discovery"
T = TypeVar("T")


class Unfound(Exception):
    """A source answered no address, or could not be read: why."""


@dataclass
class Discovery:
    """Keeps every pool's members in step with its DNS name or Kubernetes Service."""

    sessions: sessionmaker[Session]
    client: httpx.AsyncClient
    resolver: Resolver
    interval_s: float
    ok: Gauge  # draftgate_pool_discovery_ok{pool}
    allow_link_local: bool = False
    on_change: Callable[[], None] = lambda: None  # the registry's refresh
    account: ServiceAccount | None = None  # the Kubernetes API, in a pod or when configured
    failing: dict[str, str] = field(default_factory=dict)  # pool -> why its last round failed
    seen: set[str] = field(default_factory=set)  # pools resolved since this leader began
    watches: dict[tuple[str, str], tuple[EndpointSliceWatch, asyncio.Task[None]]] = field(
        default_factory=dict
    )
    wake: asyncio.Event = field(default_factory=asyncio.Event)  # a watched Service changed
    kube: httpx.AsyncClient | None = None
    holder: str = field(
        default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    )
    holds: bool = False  # the discovery lease, as of `renewed` (time.monotonic())
    renewed: float = 0.0

    @property
    def lease_s(self) -> float:
        """How long the lease outlives its holder's last renewal (renewed every third of it)."""
        return max(3 * self.interval_s, 15.0)

    async def run(self, stop: asyncio.Event) -> None:
        """A round at once, then one per interval or when a watched Service changes, until
        `stop`."""
        try:
            while not stop.is_set():
                self.wake.clear()
                try:
                    if await self._lead():
                        await self.round()
                except Exception:  # one bad round is logged, never the end of discovery
                    logger.exception("pool discovery round failed")
                await _first(stop, self.wake, seconds=self.interval_s)
        finally:
            await self._unwatch(set(self.watches))
            if self.kube is not None:
                await self.kube.aclose()
            if self.holds:
                with contextlib.suppress(Exception):  # else it lapses after lease_s
                    await asyncio.to_thread(
                        self._write, lambda s: leases.release(s, leases.DISCOVERY, self.holder)
                    )

    async def _lead(self) -> bool:
        """Whether this replica holds the discovery lease: renewed when a third of it has
        gone, taken when its holder let it go or lapsed."""
        if self.holds and time.monotonic() - self.renewed < self.lease_s / 3:
            return True
        asked = time.monotonic()
        holds = await asyncio.to_thread(self._take)
        if holds != self.holds:
            logger.info(
                "pool discovery: %s",
                "this replica leads it" if holds else "another replica leads it",
            )
        if not holds:  # the holder's watches and gauges are the ones that count
            await self._unwatch(set(self.watches))
            self.failing.clear()
            self.seen.clear()
            self.ok.clear()
        self.holds, self.renewed = holds, asked
        return holds

    def _take(self) -> bool:
        with transaction(self.sessions) as session:
            return leases.hold(session, leases.DISCOVERY, self.holder, self.lease_s)

    async def round(self) -> None:
        """Find every pool's members once and apply what changed."""
        declared = await asyncio.to_thread(self._read, pools.pools)
        for name in set(self.failing) - {p.name for p in declared}:
            del self.failing[name]
        services = {self._service(p.discovery) for p in declared}
        await self._unwatch(set(self.watches) - services)
        changed = await asyncio.gather(*(self._follow(pool) for pool in declared))
        if any(changed):
            self.on_change()

    async def _follow(self, pool: PoolCreate) -> bool:
        """One pool's round; whether its members changed."""
        try:
            found = await self._found(pool)
        except Unfound as exc:
            await self._failed(pool.name, str(exc))
            return False
        if found is None:  # a watch not yet listed: its first list wakes the next round
            return False
        addresses, complete = found
        if self.failing.pop(pool.name, None) is not None or pool.name not in self.seen:
            await asyncio.to_thread(
                self._write, lambda s: pools.set_discovery_error(s, pool.name, None)
            )
        self.seen.add(pool.name)
        self.ok.labels(pool.name).set(1)
        held = await asyncio.to_thread(self._read, lambda s: _addresses(s, pool))
        new = sorted(addresses - set(held.values()))
        healthy = await asyncio.gather(*(self._healthy(pool, a) for a in new))
        joining = [a for a, ok in zip(new, healthy, strict=True) if ok]
        # A partial answer adds members but never removes one: the record type that
        # failed may hold them.
        leaving = (
            sorted(name for name, address in held.items() if address not in addresses)
            if complete
            else []
        )
        if joining or leaving:
            await asyncio.to_thread(self._apply, pool, joining, leaving)
        return bool(joining or leaving)

    async def _found(self, pool: PoolCreate) -> tuple[frozenset[str], bool] | None:
        """The addresses `pool`'s source gives now, and whether the answer is whole."""
        source = pool.discovery
        if isinstance(source, DnsDiscovery):
            try:
                resolution = await self.resolver.resolve(source.dns)
            except DnsError as exc:
                raise Unfound(str(exc)) from exc
            if not resolution.addresses:
                raise Unfound(f"{source.dns} has no address")
            return resolution.addresses, not resolution.errors
        watch = self._watch(source)
        if watch.error is not None:
            raise Unfound(f"{watch.source}: {watch.error}")
        if not watch.listed:
            return None
        if not (addresses := watch.addresses()):
            raise Unfound(f"{watch.source} has no ready endpoint")
        return addresses, True

    def _service(self, source: DnsDiscovery | KubernetesDiscovery) -> tuple[str, str]:
        if isinstance(source, DnsDiscovery):
            return ("", "")
        default = self.account.namespace if self.account is not None else "default"
        return (source.namespace or default, source.service)

    def _watch(self, source: KubernetesDiscovery) -> EndpointSliceWatch:
        """The watch of `source`'s Service, started on first use."""
        key = self._service(source)
        if key in self.watches:
            return self.watches[key][0]
        if self.account is None:
            raise Unfound(
                "the Kubernetes API is not configured: not in a pod (KUBERNETES_SERVICE_HOST "
                "unset) and DRAFTGATE_KUBE_API_URL unset"
            )
        if self.kube is None:
            self.kube = self.account.client()
        namespace, service = key
        watch = EndpointSliceWatch(self.kube, self.account, namespace, service, self.wake.set)
        self.watches[key] = (watch, asyncio.create_task(watch.run()))
        return watch

    async def _unwatch(self, keys: set[tuple[str, str]]) -> None:
        tasks = [self.watches.pop(key)[1] for key in keys if key in self.watches]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

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


async def _first(*events: asyncio.Event, seconds: float) -> None:
    """Wait until one of `events` is set, or `seconds`."""
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
        await asyncio.gather(*waits, return_exceptions=True)
