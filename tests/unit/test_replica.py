"""What a replica's workers share: one leader at a time, and the leader's choices whole."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from gateway.policy.choices import Choices
from gateway.policy.moves import Move
from gateway.registry import Registry
from gateway.schemas.reports import FleetNow
from gateway.server.replica import Leadership, Replica, follow_choices, write_whole

MODEL = "openai/gpt-oss-20b"


def _registry() -> Registry:
    return Registry(sessionmaker[Session](), refresh_s=60.0)


def _chosen() -> Choices:
    return Choices(
        auto={MODEL: "p-eagle"},
        classes={(MODEL, "batch"): "eagle3"},
        moves={MODEL: Move("plain", "p-eagle", 1_764_000_000.0, 0.25, 15.0)},
        fleet_now={
            MODEL: FleetNow(
                concurrency=12.5,
                output_tokens_per_s=3400.0,
                routed_method="p-eagle",
                desired_replicas={"p-eagle": 2, "plain": 0},
            )
        },
    )


async def _until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    for _ in range(int(timeout_s / 0.05)):
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not within {timeout_s} s")


def test_a_follower_adopts_every_part_of_the_leaders_choices() -> None:
    leader = _chosen()
    adopted = Choices.from_json(leader.to_json())
    assert adopted.auto == leader.auto
    assert adopted.classes == leader.classes
    assert adopted.moves == leader.moves
    assert adopted.fleet_now == leader.fleet_now
    assert adopted == leader


def test_choices_are_one_frozen_value() -> None:
    """No one changes a published value: the selector publishes another one whole."""
    given = {MODEL: "p-eagle"}
    choices = Choices(auto=given)
    given[MODEL] = "plain"  # the caller's dict is not the value's
    assert choices.method(MODEL) == "p-eagle"
    with pytest.raises(TypeError):
        choices.auto[MODEL] = "plain"  # type: ignore[index]
    with pytest.raises(AttributeError):
        choices.auto = {}  # type: ignore[misc]
    assert (
        Choices(auto={MODEL: "plain"}, classes={(MODEL, "batch"): "eagle3"}).method(MODEL, "batch")
        == "eagle3"
    )


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
    follower.choices = Choices(auto={"stale": "plain"})  # replaced whole, not merged
    leader = _chosen()
    write_whole(path, leader.to_json())
    await _until(lambda: follower.choices == leader)
    leader = Choices(auto={MODEL: "dflash"})
    write_whole(path, leader.to_json())
    await _until(lambda: follower.choices.auto == {MODEL: "dflash"})
    stop.set()
    await asyncio.wait_for(following, 5.0)
    names = await asyncio.to_thread(os.listdir, tmp_path)
    assert names == [path.name]  # the temporary file was renamed, not left behind
