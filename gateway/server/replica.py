"""What the worker processes of one replica share: a directory, a leader, the leader's choices.

`draftgate gateway --workers N` runs N processes on one listening socket
(gateway/server/workers.py), each a full data plane. Work that must happen once per replica
(the selector's choices and audits, measurement writes, webhooks, retention, the readiness
gauge) runs in one of them, the *leader*: the worker holding an exclusive write lock on
`leader.lock` in the replica's directory (this user's alone: gateway/server/private.py).
The kernel releases the lock when its holder dies, however it dies, and the next worker to
try (every `LEADER_POLL_S`) takes over.

The leader publishes through files in the same directory, each replaced whole (written to a
temporary name, then renamed), so a reader sees one version or the next, never half of one:
- `choices.json`: the selector's state (its method per auto model and per request class, the
  gradual moves under way, its sizing per model), which the other workers route by;
- `leader-gauges.prom`: the gauges only the leader sets, for every worker's `/metrics`.
Every worker stamps `change.<slot>` after an admin change and confirms the others' in
`ack.<slot>` (`Changes`), so a change applies on every worker before the admin API answers.
Counters, histograms and the per-worker gauges go through prometheus-client's multiprocess
files in `metrics/` (gateway/metrics.py).

A process with no replica directory (one worker, the default) is its own leader at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.exc import SQLAlchemyError

from gateway.policy.choices import Choices
from gateway.registry import Registry
from gateway.server.private import read_private, try_lock, write_whole

logger = logging.getLogger(__name__)
LEADER_POLL_S = 0.5  # how soon a worker notices the leader is gone
# how soon a worker routes by the leader's new choices, and how old the leader's gauges may
# be on another worker's /metrics
FOLLOW_POLL_S = 0.5
CHANGE_POLL_S = 0.05  # how soon a worker reloads after another worker's admin change
CHANGE_WAIT_S = 2.0  # the longest an admin change waits for the other workers to reload
CHOICES_FILE = "choices.json"
GAUGES_FILE = "leader-gauges.prom"
LOCK_FILE = "leader.lock"
METRICS_DIR = "metrics"


@dataclass(frozen=True)
class Replica:
    """This worker's place in its replica: the shared directory and its slot (0..N-1)."""

    directory: Path
    slot: int

    @property
    def metrics_dir(self) -> Path:
        return self.directory / METRICS_DIR

    @property
    def gauges_file(self) -> Path:
        return self.directory / GAUGES_FILE

    @property
    def choices_file(self) -> Path:
        return self.directory / CHOICES_FILE


class Leadership:
    """Whether this worker leads its replica; `acquire` waits until it does."""

    def __init__(self, replica: Replica | None) -> None:
        self.replica = replica
        self._lock_fd: int | None = None

    async def acquire(self, stop: asyncio.Event) -> bool:
        """Wait until this worker holds the leader lock (True), or until `stop` (False)."""
        if self.replica is None:
            return True
        while not stop.is_set():
            if self._try_lock(self.replica.directory / LOCK_FILE):
                logger.info("worker %d (pid %d) leads its replica", self.replica.slot, os.getpid())
                return True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), LEADER_POLL_S)
        return False

    def release(self) -> None:
        """Let another worker lead (at a graceful stop; a dead process releases at once)."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _try_lock(self, path: Path) -> bool:
        fd = try_lock(path)
        if fd is None:
            return False
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)  # who leads, for a person looking
        self._lock_fd = fd  # held open (and so locked) for the life of the process
        return True


async def follow_choices(path: Path, registry: Registry, stop: asyncio.Event) -> None:
    """Adopt the leader's choices whenever `path` changes, until `stop` (or this worker
    leads: the caller cancels this then)."""
    seen, said = b"", ""
    while not stop.is_set():
        try:
            data = await asyncio.to_thread(read_private, path)  # small: compared whole
            if data != seen:
                seen = data
                registry.choices = Choices.from_json(data)
        except FileNotFoundError:  # no leader has published yet
            pass
        except (OSError, ValueError, KeyError, TypeError) as exc:  # not the leader's writing
            if str(exc) != said:  # said once, not at every poll
                logger.warning("%s is not the selector's choices (%s); kept", path, exc)
                said = str(exc)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), FOLLOW_POLL_S)


async def publish_forever(
    replica: Replica, registry: Registry, gauges: Callable[[], bytes], stop: asyncio.Event
) -> None:
    """The leader's loop: publish the selector's choices when they change, and the replica's
    gauges, every `FOLLOW_POLL_S` until `stop`."""
    published = None
    while not stop.is_set():
        choices = registry.choices  # one value, replaced whole by the selector
        if choices != published:
            await asyncio.to_thread(write_whole, replica.choices_file, choices.to_json())
            published = choices
        await asyncio.to_thread(write_whole, replica.gauges_file, gauges())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), FOLLOW_POLL_S)


class Changes:
    """Admin changes told to the replica's other workers before the admin API answers.

    The worker that committed a change has reloaded its registry; it then stamps
    `change.<slot>` and waits until every other worker has reloaded too and says so in
    `ack.<slot>` (each polls every `CHANGE_POLL_S`), so a change applies on the whole replica
    at once, as it does with one process. A worker that does not answer within
    `CHANGE_WAIT_S` (dead, restarting) is not waited for longer: it reads the database when it
    starts, and every worker reloads every `registry_refresh_s` anyway.
    """

    def __init__(self, replica: Replica, workers: int) -> None:
        self.replica, self.others = replica, [s for s in range(workers) if s != replica.slot]
        self._lock = threading.Lock()
        self._stamp = 0

    def announce_and_wait(self) -> bool:
        """Tell the other workers of a committed change; True once all have reloaded
        (blocking: from an admin route's thread)."""
        with self._lock:  # stamps grow, across restarts too (a clock) and within one
            self._stamp = stamp = max(self._stamp + 1, time.time_ns())
            write_whole(self._file("change", self.replica.slot), b"%d" % stamp)
        deadline = time.monotonic() + CHANGE_WAIT_S
        while not all(self._acked(slot) >= stamp for slot in self.others):
            if time.monotonic() > deadline:
                logger.warning(
                    "not every worker confirmed an admin change within %g s", CHANGE_WAIT_S
                )
                return False
            time.sleep(CHANGE_POLL_S / 2)
        return True

    async def watch(self, registry: Registry, stop: asyncio.Event) -> None:
        """Reload `registry` when another worker announces a change, and confirm it; until
        `stop`."""
        seen: dict[int, int] = {}
        while not stop.is_set():
            stamps = await asyncio.to_thread(self._stamps)
            if stamps != seen:
                try:
                    await asyncio.to_thread(registry.load)
                except SQLAlchemyError as exc:  # not confirmed: tried again at the next poll
                    logger.warning("registry not reloaded after another worker's change: %s", exc)
                else:
                    seen = stamps
                    ack = json.dumps({str(slot): stamp for slot, stamp in stamps.items()})
                    await asyncio.to_thread(
                        write_whole, self._file("ack", self.replica.slot), ack.encode()
                    )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), CHANGE_POLL_S)

    def _stamps(self) -> dict[int, int]:
        """The last change each other worker announced."""
        stamps = {}
        for slot in self.others:
            with contextlib.suppress(OSError, ValueError):
                stamps[slot] = int(read_private(self._file("change", slot)))
        return stamps

    def _acked(self, slot: int) -> int:
        """The last change of this worker's that worker `slot` has reloaded for."""
        try:
            acks = json.loads(read_private(self._file("ack", slot)))
            return int(acks.get(str(self.replica.slot), 0))
        except (OSError, ValueError, AttributeError, TypeError):
            return 0

    def _file(self, kind: str, slot: int) -> Path:
        return self.replica.directory / f"{kind}.{slot}"
