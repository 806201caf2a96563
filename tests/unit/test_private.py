"""The workers' shared directory is this user's alone: made owner-only, refused when another
user could write to it, its files never opened through a link, its lock held only for writing.

Attacks as another local user would make them (these tests run as whoever runs them; where
they need another user's file, they give one to uid 65534, which needs root, and skip
otherwise)."""

from __future__ import annotations

import asyncio
import fcntl
import os
import stat
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from gateway.db.session import make_engine
from gateway.policy.choices import Choices
from gateway.registry import Registry
from gateway.server.private import UnsafeDirectory, private_directory, try_lock
from gateway.server.replica import Leadership, Replica, follow_choices, write_whole

MODEL = "openai/gpt-oss-20b"
NOBODY = 65534


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_a_new_directory_and_its_files_are_owner_only(tmp_path: Path) -> None:
    directory = private_directory(tmp_path / "state")
    write_whole(directory / "choices.json", b"{}")
    assert mode(directory) == 0o700
    assert mode(directory / "choices.json") == 0o600


@pytest.mark.parametrize("loose", [0o777, 0o775, 0o757])
def test_a_directory_others_may_write_is_refused(tmp_path: Path, loose: int) -> None:
    directory = tmp_path / "shared"
    directory.mkdir()
    directory.chmod(loose)
    with pytest.raises(UnsafeDirectory, match="written by others"):
        private_directory(directory)


def test_a_directory_only_readable_by_others_is_closed(tmp_path: Path) -> None:
    directory = tmp_path / "mine"
    directory.mkdir(mode=0o755)
    directory.chmod(0o755)
    private_directory(directory)
    assert mode(directory) == 0o700


def test_a_link_to_a_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    (tmp_path / "state").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UnsafeDirectory, match="symbolic link"):
        private_directory(tmp_path / "state")


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
def test_another_users_directory_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "theirs"
    directory.mkdir(mode=0o700)
    os.chown(directory, NOBODY, NOBODY)
    with pytest.raises(UnsafeDirectory, match=f"belongs to uid {NOBODY}"):
        private_directory(directory)


def test_links_planted_under_the_files_names_are_never_written_through(tmp_path: Path) -> None:
    """Before, the temporary name was followed: a link there overwrote its target."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    victim.chmod(0o600)
    directory = private_directory(tmp_path / "state")
    (directory / f".choices.json.{os.getpid()}").symlink_to(victim)
    (directory / "choices.json").symlink_to(victim)
    with pytest.raises(OSError, match="Too many levels of symbolic links"):
        write_whole(directory / "choices.json", b"forged")
    assert victim.read_bytes() == b"precious"
    (directory / f".choices.json.{os.getpid()}").unlink()
    write_whole(directory / "choices.json", b"{}")  # the link at the name itself is replaced
    assert victim.read_bytes() == b"precious"
    assert not (directory / "choices.json").is_symlink()


async def test_a_follower_adopts_nothing_through_a_link_nor_a_forged_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = private_directory(tmp_path / "state")
    path = directory / "choices.json"
    forged = tmp_path / "forged.json"
    forged.write_bytes(Choices(auto={MODEL: "dspark"}).to_json())
    path.symlink_to(forged)
    registry = Registry(sessionmaker[Session](), refresh_s=60.0)
    registry.choices = kept = Choices(auto={MODEL: "plain"})
    stop = asyncio.Event()
    following = asyncio.create_task(follow_choices(path, registry, stop))
    await _until(lambda: "symbolic links" in caplog.text)  # it read and refused
    assert registry.choices == kept
    path.unlink()
    write_whole(path, b'{"auto": "not a mapping"}')
    await _until(lambda: caplog.text.count("is not the selector's choices") == 2)
    assert registry.choices == kept
    write_whole(path, Choices(auto={MODEL: "eagle3"}).to_json())  # the leader's next one
    await _until(lambda: registry.choices.auto == {MODEL: "eagle3"})
    stop.set()
    await asyncio.wait_for(following, 5.0)


async def _until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    for _ in range(int(timeout_s / 0.05)):
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not within {timeout_s} s")


async def test_a_read_only_handle_cannot_hold_the_leader_lock(tmp_path: Path) -> None:
    """Before, a `flock` through a read-only handle held it, and no worker led."""
    directory = private_directory(tmp_path / "state")
    lock = directory / "leader.lock"
    lock.touch()
    with lock.open("rb") as reader:
        fcntl.flock(reader, fcntl.LOCK_EX | fcntl.LOCK_NB)  # what the attacker did
        leader = Leadership(Replica(directory, 0))
        assert await asyncio.wait_for(leader.acquire(asyncio.Event()), 5.0)
        leader.release()
    read_only = os.open(lock, os.O_RDONLY)
    try:
        with pytest.raises(OSError, match="Bad file descriptor"):
            fcntl.fcntl(read_only, fcntl.F_OFD_SETLK, _write_lock())
    finally:
        os.close(read_only)


def test_two_handles_in_one_process_exclude_each_other(tmp_path: Path) -> None:
    first = try_lock(tmp_path / "up.lock")
    assert first is not None
    assert try_lock(tmp_path / "up.lock") is None
    os.close(first)
    again = try_lock(tmp_path / "up.lock")
    assert again is not None
    os.close(again)


def test_a_sqlite_database_is_made_owner_only(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path}/draftgate.db")
    with engine.connect() as conn:
        conn.exec_driver_sql("PRAGMA journal_mode=WAL")
        conn.exec_driver_sql("CREATE TABLE t (x)")
        conn.commit()
    engine.dispose()
    made = sorted(p.name for p in tmp_path.iterdir())
    assert "draftgate.db" in made
    assert {p: mode(tmp_path / p) for p in made} == dict.fromkeys(made, 0o600)


def test_an_older_database_readable_by_others_is_closed(tmp_path: Path) -> None:
    path = tmp_path / "draftgate.db"
    path.touch()
    path.chmod(0o644)
    make_engine(f"sqlite:///{path}").dispose()
    assert mode(path) == 0o600


def _write_lock() -> bytes:
    return struct.pack("@hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
