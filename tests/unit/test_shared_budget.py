"""A key's budget over a replica's workers: one shared file, a part per worker.

Two `Limiter`s, each with its own `SharedBudgets` view of one file, stand for two workers
(each opens the file itself, as a worker does, so each `flock` is its own). A snapshot of the
ledger is what a worker's registry read: the key's spend as of that read."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from sqlalchemy.orm import sessionmaker

from gateway.errors import QuotaExceeded
from gateway.limits import Limiter
from gateway.registry import KeyView, Snapshot, team_subject
from gateway.server.inflight import INFLIGHT_FILE, KEY_IDS, SharedInFlight
from gateway.server.shared_budget import BUDGETS_FILE, SUBJECTS, SharedBudgets

DOLLAR = KeyView(7, "k", None, None, 1.0, "monthly", None)
HUGE = KeyView(KEY_IDS, "huge", None, None, 1.0, "monthly", None)


def snapshot(spent_usd: float, *keys: KeyView) -> Snapshot:
    """A registry read in which each of `keys` (DOLLAR by default) had spent `spent_usd`."""
    keys = keys or (DOLLAR,)
    return Snapshot(
        keys={f"h{k.id}": k for k in keys}, key_spend_usd={k.id: spent_usd for k in keys}
    )


def worker(directory: Path, slot: int, spent_usd: float = 0.0, workers: int = 2) -> Limiter:
    """A worker's limiter started in `slot`, its first registry read showing `spent_usd`."""
    first = snapshot(spent_usd)
    budgets = SharedBudgets(directory / BUDGETS_FILE, slot, workers, first.key_spend_usd)
    shared = SharedInFlight(directory / INFLIGHT_FILE, slot, workers)
    return Limiter(sessionmaker(), sync_s=1.0, shared=shared, budgets=budgets)


def refused(limiter: Limiter, spent_usd: float, usd: float, key: KeyView = DOLLAR) -> bool:
    """Whether `limiter` refuses a request that may cost `usd` (its snapshot: `spent_usd`)."""
    try:
        limiter.admit(key, spent_usd, 0, usd)
    except QuotaExceeded:
        return True
    return False


def test_two_workers_never_both_take_a_keys_last_dollars(tmp_path: Path) -> None:
    first, second = worker(tmp_path, 0), worker(tmp_path, 1)
    held = first.admit(DOLLAR, 0.0, 0, 0.4)
    second.admit(DOLLAR, 0.0, 0, 0.4)  # 0.8 of the dollar held over both workers
    assert refused(first, 0.0, 0.4)
    assert refused(second, 0.0, 0.4)
    first.settle(held, 10, 0.1)  # it cost 0.1 of its 0.4: 0.5 spent or held
    assert refused(first, 0.0, 0.6)
    second.admit(DOLLAR, 0.0, 0, 0.5)  # what the first worker freed, on the other


def test_spend_served_on_one_worker_counts_on_every_worker_until_each_reads_it(
    tmp_path: Path,
) -> None:
    first, second = worker(tmp_path, 0), worker(tmp_path, 1)
    first.settle(first.admit(DOLLAR, 0.0, 0, 0.6), 10, 0.6)
    assert refused(second, 0.0, 0.5)  # 0.6 served on the first worker, not yet written
    # The first worker's registry reads the ledger with the 0.6 written: its own spend since
    # is gone, and the second worker, whose snapshot still says 0.0, sees the first's.
    first.snapshot_starting({})
    first.snapshot_loaded(snapshot(0.6))
    assert refused(second, 0.0, 0.5)
    second.admit(DOLLAR, 0.0, 0, 0.4)


def test_a_registry_read_keeps_what_it_cannot_include_per_worker(tmp_path: Path) -> None:
    """Spend the ledger has not written when a read begins, and spend served during the
    read, stay counted on the worker that served it after the read."""
    first, second = worker(tmp_path, 0), worker(tmp_path, 1)
    first.settle(first.admit(DOLLAR, 0.0, 0, 0.3), 10, 0.3)  # written before the read
    first.snapshot_starting({DOLLAR.id: 0.2})  # of which 0.2 is still in the ledger's queue
    first.settle(first.admit(DOLLAR, 0.0, 0, 0.1), 10, 0.1)  # served while it reads
    first.snapshot_loaded(snapshot(0.1))  # the read saw 0.1 of the 0.3 written
    assert refused(second, 0.0, 0.61)  # 0.1 read + 0.2 unwritten + 0.1 served = 0.4
    second.admit(DOLLAR, 0.0, 0, 0.59)


def test_a_worker_started_again_forgets_its_dead_predecessors_figures(tmp_path: Path) -> None:
    first, second = worker(tmp_path, 0), worker(tmp_path, 1)
    first.admit(DOLLAR, 0.0, 0, 0.3)
    second.settle(second.admit(DOLLAR, 0.0, 0, 0.3), 10, 0.2)  # written by its ledger
    second.admit(DOLLAR, 0.0, 0, 0.4)  # then the second worker dies with this request
    assert refused(first, 0.0, 0.2)  # 0.3 + 0.2 + 0.4 of the dollar, and 0.2 more
    worker(tmp_path, 1, spent_usd=0.2)  # started in its slot: its first read has the 0.2
    first.admit(DOLLAR, 0.0, 0, 0.5)  # 0.3 held here, 0.2 spent: 0.5 left
    assert refused(first, 0.0, 0.01)


def test_a_key_given_a_budget_counts_what_its_requests_in_flight_then_cost(
    tmp_path: Path,
) -> None:
    free = KeyView(7, "k", None, None, None, "monthly", None)
    first, second = worker(tmp_path, 0), worker(tmp_path, 1)
    held = first.admit(free, 0.0, 0, 0.0)  # no budget yet: nothing reserved
    for either in (first, second):  # the budget arrives through an admin change
        either.snapshot_starting({})
        either.snapshot_loaded(snapshot(0.0))
    first.settle(held, 10, 0.7)
    assert refused(second, 0.0, 0.4)


def test_budget_use_is_read_over_every_worker(tmp_path: Path) -> None:
    first, second = worker(tmp_path, 0), worker(tmp_path, 1)
    second.settle(second.admit(DOLLAR, 0.0, 0, 0.5), 10, 0.25)
    first.admit(DOLLAR, 0.0, 0, 0.5)  # reservations are not spend
    assert first.budget_used(snapshot(0.5)) == {("7", "k"): pytest.approx(0.75)}


def test_keys_beyond_the_table_are_held_per_worker(tmp_path: Path) -> None:
    first, second = worker(tmp_path, 0), worker(tmp_path, 1)
    first.admit(HUGE, 0.0, 0, 0.8)
    second.admit(HUGE, 0.0, 0, 0.8)  # its own dollar on the second worker
    assert refused(first, 0.0, 0.8, HUGE)


def test_the_file_is_sparse_and_a_restart_clears_only_what_its_slot_used(
    tmp_path: Path,
) -> None:
    last = KeyView(KEY_IDS - 1, "last", None, None, 1.0, "monthly", None)
    limiters = [worker(tmp_path, slot, workers=3) for slot in range(3)]
    for slot, limiter in enumerate(limiters):
        limiter.admit(last, 0.0, 0, 0.1 * (slot + 1))
    assert refused(limiters[0], 0.0, 0.41, last)  # 0.6 held over three workers
    worker(tmp_path, 2, workers=3)  # the third dies and starts again
    limiters[0].admit(last, 0.0, 0, 0.7)  # 0.3 held by the first two
    path = tmp_path / BUDGETS_FILE
    assert path.stat().st_size == 3 * SUBJECTS * 3 * 8  # 76.5 MiB long: keys, then teams
    assert os.stat(path).st_blocks * 512 < 1 << 20  # a few pages used


def test_a_teams_budget_is_shared_over_the_workers_apart_from_its_keys(tmp_path: Path) -> None:
    """A team is counted under its id below 0 (registry.team_subject): its figures stand
    beside its keys', never on them, and both workers see its dollar."""
    team = KeyView(team_subject(7), "team", None, None, 1.0, "monthly", None)
    first, second = worker(tmp_path, 0), worker(tmp_path, 1)
    first.admit(team, 0.0, 0, 0.6)
    assert refused(second, 0.0, 0.6, team)  # the other worker sees the team's 0.6 held
    assert not refused(second, 0.0, 0.6)  # key 7's dollar is its own
