"""Requests in flight per API key over the worker processes of one replica, for a key's
`max_concurrent_requests` (gateway/limits.py).

Each worker counts its own requests per key in its own part of one shared file (`inflight`
in the replica's directory): an int32 per key id below `KEY_IDS`, at
`slot * KEY_IDS + key_id`. An admission reads every worker's count of its key and adds one
to this worker's own under an exclusive `flock` of the file, so two workers never both take
a key's last place. The file is sparse: only the pages of key ids in use take memory (4 KiB
per 1,024 ids per worker), on a memory file system too.

A worker that dies leaves its counts behind; the worker started in its slot clears them
before it serves, since the requests they counted died with it.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gateway.server.private import open_private

KEY_IDS = 1 << 20  # keys with larger ids are counted per worker (gateway/limits.py)
INFLIGHT_FILE = "inflight"
COUNT_BYTES = 4


class SharedInFlight:
    """This worker's view of the replica's requests in flight per key."""

    def __init__(self, path: Path, slot: int, workers: int) -> None:
        size = workers * KEY_IDS * COUNT_BYTES
        self._fd = open_private(path, os.O_RDWR | os.O_CREAT)
        if os.fstat(self._fd).st_size < size:  # every worker asks for the same size
            os.ftruncate(self._fd, size)
        self._map = mmap.mmap(self._fd, size)
        self._counts = memoryview(self._map).cast("i")
        self._own = slot * KEY_IDS
        self._slots = range(0, workers * KEY_IDS, KEY_IDS)
        self._clear_own()

    def covers(self, key_id: int) -> bool:
        """Whether the key's requests are counted here (else per worker)."""
        return 0 <= key_id < KEY_IDS

    @contextmanager
    def locked(self) -> Iterator[None]:
        """No other worker admits while this is held (a check, then its count)."""
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def total(self, key_id: int) -> int:
        """The key's requests in flight on every worker."""
        counts = self._counts
        return sum(counts[start + key_id] for start in self._slots)

    def add(self, key_id: int, requests: int) -> None:
        """Count `requests` more (or fewer) in flight on this worker."""
        self._counts[self._own + key_id] += requests

    def _clear_own(self) -> None:
        """Forget the counts a dead predecessor in this slot left."""
        start = self._own * COUNT_BYTES
        clear_part(self._fd, self._map, start, start + KEY_IDS * COUNT_BYTES)


def clear_part(fd: int, mapped: mmap.mmap, start: int, end: int) -> None:
    """Zero the pages from `start` to `end` (page-aligned) of a shared sparse file that hold
    data, found with SEEK_DATA so that no hole is read (on a memory file system, reading a
    hole through the map allocates its page)."""
    zero, page = bytes(mmap.PAGESIZE), mmap.PAGESIZE
    offset = start
    while offset < end:
        try:
            data = os.lseek(fd, offset, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # nothing but holes from here on
                return
            raise
        hole = min(os.lseek(fd, data, os.SEEK_HOLE), end)
        for at in range(data - data % page, hole, page):
            if mapped[at : at + page] != zero:
                mapped[at : at + page] = zero
        offset = hole
