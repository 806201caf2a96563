"""A key's requests in flight over a replica's workers: one shared file, a part per worker.

Two `SharedInFlight` views of one file stand for two workers (each opens the file itself,
as a worker does, so each `flock` is its own)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.orm import sessionmaker

from gateway.errors import RateLimited
from gateway.limits import Limiter
from gateway.registry import KeyView
from gateway.server.inflight import INFLIGHT_FILE, KEY_IDS, SharedInFlight

MEMORY_FS = Path("/dev/shm")  # noqa: S108 (the tests make a private directory in it)
TWO = KeyView(7, "k", None, None, None, "monthly", None, max_concurrent_requests=2)


def worker(directory: Path, slot: int) -> Limiter:
    """A worker's limiter, counting in flight over both workers."""
    shared = SharedInFlight(directory / INFLIGHT_FILE, slot, workers=2)
    return Limiter(sessionmaker(), sync_s=1.0, shared=shared)


def test_a_keys_places_are_shared_by_the_workers(tmp_path: Path) -> None:
    first, second = worker(tmp_path, 0), worker(tmp_path, 1)
    held = first.admit(TWO, 0.0, 0, 0.0)
    second.admit(TWO, 0.0, 0, 0.0)
    for either in (first, second):
        with pytest.raises(RateLimited) as refused:
            either.admit(TWO, 0.0, 0, 0.0)
        assert refused.value.code == "concurrency_limit_exceeded"
    first.settle(held, 0, None)
    second.admit(TWO, 0.0, 0, 0.0)  # the place the first worker freed


def test_a_worker_started_again_forgets_its_dead_predecessors_counts(tmp_path: Path) -> None:
    first, second = worker(tmp_path, 0), worker(tmp_path, 1)
    first.admit(TWO, 0.0, 0, 0.0)
    second.admit(TWO, 0.0, 0, 0.0)  # then the second worker dies with its request
    again = worker(tmp_path, 1)  # and is started in its slot
    again.admit(TWO, 0.0, 0, 0.0)
    with pytest.raises(RateLimited):
        first.admit(TWO, 0.0, 0, 0.0)  # the first worker's request still holds its place


def test_counts_over_slots_and_beyond_the_table(tmp_path: Path) -> None:
    path = tmp_path / INFLIGHT_FILE
    views = [SharedInFlight(path, slot, workers=3) for slot in range(3)]
    for slot, view in enumerate(views):
        view.add(KEY_IDS - 1, slot + 1)
    assert [view.total(KEY_IDS - 1) for view in views] == [6, 6, 6]
    assert views[0].total(KEY_IDS - 2) == 0
    assert views[0].covers(KEY_IDS - 1)
    assert not views[0].covers(KEY_IDS)
    assert path.stat().st_blocks * 512 < 1 << 20  # 12 MiB long, a few pages used


def test_keys_beyond_the_table_are_counted_per_worker(tmp_path: Path) -> None:
    huge = KeyView(KEY_IDS, "huge", None, None, None, "monthly", None, max_concurrent_requests=1)
    first, second = worker(tmp_path, 0), worker(tmp_path, 1)
    held = first.admit(huge, 0.0, 0, 0.0)
    second.admit(huge, 0.0, 0, 0.0)  # its own place on the second worker
    with pytest.raises(RateLimited):
        first.admit(huge, 0.0, 0, 0.0)
    first.settle(held, 0, None)
    first.admit(huge, 0.0, 0, 0.0)


@pytest.fixture
def memory_dir() -> Iterator[Path]:
    """A directory on a memory file system, where reading a hole of a mapped file takes a
    page (skipped where there is none)."""
    if not MEMORY_FS.is_dir():
        pytest.skip(f"no memory file system at {MEMORY_FS}")
    with tempfile.TemporaryDirectory(dir=MEMORY_FS) as directory:  # a private one, removed
        yield Path(directory)


def test_a_restart_clears_every_count_of_its_slot_and_reads_no_hole(memory_dir: Path) -> None:
    path = memory_dir / INFLIGHT_FILE
    first, second = SharedInFlight(path, 0, workers=2), SharedInFlight(path, 1, workers=2)
    for key_id in (0, KEY_IDS // 2, KEY_IDS - 1):
        first.add(key_id, 1)
        second.add(key_id, 2)
    again = SharedInFlight(path, 1, workers=2)  # the second dies and starts again
    assert [again.total(k) for k in (0, KEY_IDS // 2, KEY_IDS - 1)] == [1, 1, 1]
    assert path.stat().st_blocks * 512 <= 6 * 4096  # the pages used, not 8 MiB of holes
