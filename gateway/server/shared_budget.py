"""A key's budget over the worker processes of one replica: what each worker's requests in
flight hold and what it served since its snapshot of the ledger (gateway/limits.py).

Each worker keeps three float64 figures per key in its own part of one shared file
(`budgets` in the replica's directory), at `(slot * SUBJECTS + index) * 3` (a key's index
is its id; a team's, below 0, is `KEY_IDS - id`: docs/teams.md): the USD its
requests in flight hold (each its worst case, reserved at admission), the USD it served that
its registry's snapshot of the ledger does not include yet, and the key's spend in that
snapshot. A budget admission reads every worker's figures and adds its reservation to its
own under an exclusive `flock` of the file, so two workers never both take a key's last
dollars. The file is sparse: only the pages of key ids in use take memory (4 KiB per 170 ids
per worker).

Workers read the ledger at different moments, so the key's spend is the largest snapshot any
worker holds (the newest: a period's spend only grows) plus what every worker served since
its own snapshot. Each worker's own part covers everything it served after its snapshot, so
no dollar is missed; what was written between the oldest and the newest snapshot is counted
twice until the older ones are read again (at most `registry_refresh_s`, 2 s by default), so
a budget is refused early then, never late. After a budget period turns, a worker that has
not read the new period yet holds the old period's spend for as long.

A worker that dies leaves its figures behind; the worker started in its slot clears them and
writes its own first snapshot, under the lock at once: the requests they held died with it,
and what its ledger wrote is in that snapshot. Until then (the restart: a second or two) the
key is refused early, by the dead requests' reservations and by what the dead worker served
that the others' snapshots may already hold (up to its last 2.5 s: one ledger flush and one
registry refresh), never counted short. What a killed worker's ledger had not written is
lost to the budget as to the bill: what its requests in flight cost (each at most its
reservation) and what it served in its last 0.5 s (one ledger flush), or for as long as the
database was unreachable.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from gateway.server.inflight import KEY_IDS, clear_part
from gateway.server.private import open_private

BUDGETS_FILE = "budgets"
TEAM_IDS = 1 << 16  # teams with larger ids have their budgets kept per worker
SUBJECTS = KEY_IDS + TEAM_IDS  # keys, then teams
FIGURE_BYTES = 8
FIGURES = 3  # per key and worker: reserved, unsnapshotted, snapshot
RESERVED, UNSNAPSHOTTED, SNAPSHOT = range(FIGURES)


@dataclass(frozen=True, slots=True)
class BudgetFigures:
    """A key's figures over every worker of the replica."""

    snapshot_usd: float  # its spend in the newest of the workers' snapshots
    unsnapshotted_usd: float  # served by each worker since its own snapshot, summed
    reserved_usd: float  # held by requests in flight on every worker


def _index(key_id: int) -> int:
    """Where a key's figures (or a team's: its id below 0) are in a worker's part."""
    return key_id if key_id >= 0 else KEY_IDS - key_id


class SharedBudgets:
    """This worker's view of the replica's budget figures per key."""

    def __init__(
        self, path: Path, slot: int, workers: int, snapshot_usd: Mapping[int, float]
    ) -> None:
        """Open the file and take over slot `slot`: a dead predecessor's figures cleared
        and `snapshot_usd` (spend per budgeted key id) written, both before any other
        worker reads them."""
        size = workers * SUBJECTS * FIGURES * FIGURE_BYTES
        self._fd = open_private(path, os.O_RDWR | os.O_CREAT)
        if os.fstat(self._fd).st_size < size:  # every worker asks for the same size
            os.ftruncate(self._fd, size)
        self._map = mmap.mmap(self._fd, size)
        self._figures = memoryview(self._map).cast("d")
        self._own = slot * SUBJECTS * FIGURES
        self._slots = range(0, workers * SUBJECTS * FIGURES, SUBJECTS * FIGURES)
        self._thread_lock = threading.Lock()  # a flock does not exclude this process's threads
        with self.locked():
            self._clear_own()
            self.publish_snapshot(snapshot_usd)

    def covers(self, key_id: int) -> bool:
        """Whether the key's (or team's: below 0) figures are shared here (else kept per
        worker)."""
        return -TEAM_IDS < key_id < KEY_IDS

    @contextmanager
    def locked(self) -> Iterator[None]:
        """No other worker or thread reads or changes figures while this is held."""
        with self._thread_lock:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def figures(self, key_id: int) -> BudgetFigures:
        """The key's figures over every worker (ours as last written); call locked."""
        figures, at = self._figures, _index(key_id) * FIGURES
        snapshot = unsnapshotted = reserved = 0.0
        for start in self._slots:
            snapshot = max(snapshot, figures[start + at + SNAPSHOT])
            unsnapshotted += figures[start + at + UNSNAPSHOTTED]
            reserved += figures[start + at + RESERVED]
        return BudgetFigures(snapshot, unsnapshotted, reserved)

    def write(self, key_id: int, reserved_usd: float, unsnapshotted_usd: float) -> None:
        """This worker's reservations and unsnapshotted spend of a key; call locked."""
        at = self._own + _index(key_id) * FIGURES
        self._figures[at + RESERVED] = reserved_usd
        self._figures[at + UNSNAPSHOTTED] = unsnapshotted_usd

    def publish_snapshot(self, snapshot_usd: Mapping[int, float]) -> None:
        """The keys' spend in this worker's latest snapshot; call locked, together with
        the unsnapshotted spend that snapshot now includes."""
        figures, own = self._figures, self._own + SNAPSHOT
        for key_id, usd in snapshot_usd.items():
            if self.covers(key_id):
                figures[own + _index(key_id) * FIGURES] = usd

    def _clear_own(self) -> None:
        """Forget the figures a dead predecessor in this slot left."""
        start = self._own * FIGURE_BYTES
        clear_part(self._fd, self._map, start, start + SUBJECTS * FIGURES * FIGURE_BYTES)
