"""What a replica's workers share: one leader at a time, and the leader's choices whole."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from gateway.policy.moves import Move
from gateway.registry import Registry
from gateway.schemas.reports import FleetNow
from gateway.server.replica import (
    Leadership,
    Replica,
    adopt_choices,
    choices_json,
    follow_choices,
    write_whole,
)

MODEL = "openai/gpt-oss-20b"


def _registry() -> Registry:
    return Registry(sessionmaker[Session](), refresh_s=60.0)


def _chosen() -> Registry:
    registry = _registry()
    registry.auto_choice[MODEL] = "p-eagle"
    registry.class_choice[(MODEL, "batch")] = "eagle3"
    registry.auto_moves[MODEL] = Move("plain", "p-eagle", 1_764_000_000.0, 0.25, 15.0)
    registry.fleet_now[MODEL] = FleetNow(
        concurrency=12.5,
        output_tokens_per_s=3400.0,
        routed_method="p-eagle",
        desired_replicas={"p-eagle": 2, "plain": 0},
    )
    return registry


async def _until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    for _ in range(int(timeout_s / 0.05)):
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not within {timeout_s} s")


def test_a_follower_adopts_every_part_of_the_leaders_choices() -> None:
    leader, follower = _chosen(), _registry()
    follower.auto_choice["stale"] = "plain"  # replaced whole, not merged
    adopt_choices(follower, choices_json(leader))
    assert follower.auto_choice == leader.auto_choice
    assert follower.class_choice == leader.class_choice
    assert follower.auto_moves == leader.auto_moves
    assert follower.fleet_now == leader.fleet_now


async def test_one_worker_leads_and_the_next_takes_over_when_it_is_gone(tmp_path: Path) -> None:
    stop = asyncio.Event()
    first, second = Leadership(Replica(tmp_path, 0)), Leadership(Replica(tmp_path, 1))
    assert await first.acquire(stop)
    waiting = asyncio.create_task(second.acquire(stop))
    await asyncio.sleep(1.2)  # two polls of the lock: the first still holds it
    assert not waiting.done()
    first.release()  # as a graceful stop does, and the kernel when the leader dies
    assert await asyncio.wait_for(waiting, 5.0)
    second.release()
    assert (tmp_path / "leader.lock").read_text(encoding="utf-8").strip().isdigit()


async def test_without_a_replica_directory_the_process_leads_at_once() -> None:
    assert await Leadership(None).acquire(asyncio.Event())


async def test_a_follower_routes_by_each_new_version_of_the_file(tmp_path: Path) -> None:
    path, follower, stop = tmp_path / "choices.json", _registry(), asyncio.Event()
    following = asyncio.create_task(follow_choices(path, follower, stop))
    leader = _chosen()
    write_whole(path, choices_json(leader))
    await _until(lambda: follower.auto_choice == leader.auto_choice)
    leader.auto_choice[MODEL] = "dflash"
    write_whole(path, choices_json(leader))
    await _until(lambda: follower.auto_choice == {MODEL: "dflash"})
    stop.set()
    await asyncio.wait_for(following, 5.0)
    names = await asyncio.to_thread(os.listdir, tmp_path)
    assert names == [path.name]  # the temporary file was renamed, not left behind
