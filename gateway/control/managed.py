"""Managed backends: servers this draftgate process started, and moving one to another method.

A switch starts the new server beside the old one and waits until it is healthy; then, in
one transaction, it registers the new backend and disables the old one, and reloads the
registry at once, so new requests go to the new server. The old server finishes what it
has in flight (this gateway's count and the server's own running + waiting both at zero,
after every replica has had a refresh interval to notice), is stopped by its own process,
and its row is removed. A new server that does not come up is stopped and the old backend
is left exactly as it was; every step is in the audit log.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import httpx
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from backends.launcher import LaunchError, LocalServer
from backends.vllm_metrics import parse_metrics
from gateway.db import queries
from gateway.db.session import transaction
from gateway.errors import Conflict
from gateway.registry import Registry
from gateway.schemas.resources import BackendCreate
from gateway.services.backends import (
    delete_backend,
    record_switch_failure,
    release_stopped,
    shift_backend,
)
from gateway.settings import Settings

logger = logging.getLogger(__name__)
ACTOR = "control-plane"
DRAIN_POLL_S = 0.2

# How to start a server for a backend's fields on a port, logging to a path.
Launch = Callable[[BackendCreate, int, Path], LocalServer]


@dataclass(frozen=True)
class SwitchTimeouts:
    """How long a switch waits for each step."""

    start_s: float
    drain_s: float
    replica_refresh_s: float  # other gateway replicas notice the change within this


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


class ManagedBackends:
    """The server processes this gateway owns, by backend name, and their switches."""

    def __init__(
        self, launch: Launch | None, log_dir: Path, servers: Iterable[LocalServer] = ()
    ) -> None:
        self.launch, self.log_dir = launch, log_dir
        self.servers = {s.name: s for s in servers}
        self._switching: dict[str, asyncio.Task[None]] = {}

    def check_switchable(self, name: str) -> None:
        """Raise Conflict unless `name` is a server this process runs and is not switching."""
        if self.launch is None or name not in self.servers:
            raise Conflict(f"backend {name!r} is not managed by this gateway process", param="name")
        if name in self._switching:
            raise Conflict(f"backend {name!r} is already being switched", param="name")

    async def begin_switch(
        self,
        old_name: str,
        target: BackendCreate,
        registry: Registry,
        sessions: sessionmaker[Session],
        settings: Settings,
    ) -> None:
        """Move the managed backend `old_name` to `target` in the background, with the
        settings' timeouts; Conflict when it cannot switch now."""
        timeouts = SwitchTimeouts(
            start_s=settings.managed_start_timeout_s,
            drain_s=settings.managed_drain_timeout_s,
            replica_refresh_s=settings.registry_refresh_s,
        )
        await self.begin(Switch(old_name, target, registry, sessions, timeouts))

    async def begin(self, switch: Switch) -> None:
        """Run `switch` in the background; Conflict when its backend cannot switch now."""
        self.check_switchable(switch.old_name)
        task = asyncio.create_task(switch.run(self))
        self._switching[switch.old_name] = task
        task.add_done_callback(lambda _: self._switching.pop(switch.old_name, None))

    async def wait_idle(self) -> None:
        """Wait for switches in progress (tests and shutdown)."""
        await asyncio.gather(*self._switching.values(), return_exceptions=True)

    async def close(self, sessions: sessionmaker[Session]) -> None:
        """Cancel switches in progress, stop every server this process started, and mark
        their backends disabled (audited), so they are no longer billed as held."""
        for task in self._switching.values():
            task.cancel()
        await self.wait_idle()
        await asyncio.gather(*(asyncio.to_thread(s.stop) for s in self.servers.values()))
        if self.servers:
            try:
                await asyncio.to_thread(self._release, sessions, list(self.servers))
            except SQLAlchemyError as exc:
                logger.warning("stopped backends not marked disabled: %s", exc)

    @staticmethod
    def _release(sessions: sessionmaker[Session], names: list[str]) -> None:
        with transaction(sessions) as session:
            release_stopped(session, names, ACTOR)


@dataclass
class Switch:
    """Move the managed backend `old_name` to the backend described by `target`."""

    old_name: str
    target: BackendCreate
    registry: Registry
    sessions: sessionmaker[Session]
    timeouts: SwitchTimeouts

    async def run(self, managed: ManagedBackends) -> None:
        """Start, shift, drain, stop; on a failed start, leave everything as it was."""
        try:
            await self._run(managed)
        except Exception:  # the top of a background task: log it, never lose it
            logger.exception("switch of backend %r failed", self.old_name)
            raise

    async def _run(self, managed: ManagedBackends) -> None:
        assert managed.launch is not None
        port = free_port()
        self.target = BackendCreate.model_validate(
            {**self.target.model_dump(), "url": f"http://127.0.0.1:{port}"}
        )
        server = managed.launch(self.target, port, managed.log_dir / f"{self.target.name}.log")
        try:
            server.start()
            await server.wait_healthy_async(self.timeouts.start_s)
        except LaunchError as exc:
            await asyncio.to_thread(server.stop)
            await asyncio.to_thread(self._record_failure, str(exc))
            return
        except BaseException:  # cancelled at shutdown: the half-started server goes too
            server.stop()
            raise
        managed.servers[self.target.name] = server
        try:
            old_url = await asyncio.to_thread(self._shift)
        except Exception:  # the top of a background task: undo the start, then report
            managed.servers.pop(self.target.name, None)
            await asyncio.to_thread(server.stop)
            raise
        await asyncio.to_thread(self.registry.load)
        await self._drain(old_url)
        old = managed.servers.pop(self.old_name)
        await asyncio.to_thread(old.stop)
        await asyncio.to_thread(self._retire)
        await asyncio.to_thread(self.registry.load)

    def _shift(self) -> str:
        """Register the new backend and disable the old one, in one transaction."""
        with transaction(self.sessions) as session:
            return shift_backend(session, self.old_name, self.target, ACTOR)

    async def _drain(self, url: str) -> None:
        """Until nothing is in flight on the old server, or the drain timeout passes."""
        start = time.monotonic()
        deadline = start + self.timeouts.drain_s
        async with httpx.AsyncClient(base_url=url, timeout=2.0) as client:
            while time.monotonic() < deadline:
                settled = time.monotonic() - start >= self.timeouts.replica_refresh_s
                if settled and self._idle_here() and await _idle_upstream(client):
                    return
                await asyncio.sleep(DRAIN_POLL_S)
        logger.warning(
            "backend %r still busy after %.0f s; stopping it anyway",
            self.old_name,
            self.timeouts.drain_s,
        )

    def _idle_here(self) -> bool:
        state = self.registry.states.get(self.old_name)
        return state is None or state.in_flight == 0

    def _retire(self) -> None:
        with transaction(self.sessions) as session:
            if queries.find_backend(session, self.old_name) is not None:
                delete_backend(session, self.old_name, ACTOR)

    def _record_failure(self, reason: str) -> None:
        logger.warning("switch of backend %r failed: %s", self.old_name, reason)
        with transaction(self.sessions) as session:
            record_switch_failure(session, self.old_name, self.target, reason, ACTOR)


async def _idle_upstream(client: httpx.AsyncClient) -> bool:
    """The server reports nothing running or waiting (unknown counts as idle)."""
    try:
        response = await client.get("/metrics")
        snapshot = parse_metrics(response.text) if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return True
    return snapshot is None or snapshot.running + snapshot.waiting == 0
