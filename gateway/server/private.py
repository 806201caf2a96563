"""Directories and files only this user may touch: the workers' shared directory,
`make up`'s `.draftgate/` and the SQLite database in it.

What the workers share there steers the replica: who leads (`leader.lock`), how every worker
routes (`choices.json`), per-key counts. So a directory another user created, or may write
to, is refused at start with the reason; a new one is made owner-only (0700) and its files
0600. Every file in it is opened without following a symlink, so a link planted under one
of its names can make the gateway neither write through it nor read it; a file is replaced
by a rename, which replaces a link itself, never what it points to. A lock (the leader's,
`make up`'s) is a write lock of the open file (Linux's open-file-description lock): only a
handle open for writing can hold it (a `flock` could be held through a read-only one), and,
unlike a process's POSIX lock, two handles in one process exclude each other too.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import struct
from pathlib import Path

DIRECTORY_MODE = 0o700
FILE_MODE = 0o600
_NO_LINKS = os.O_NOFOLLOW | os.O_CLOEXEC
# struct flock (type, whence, start, len, pid; 0 length: the whole file; pid 0, as open-file
# locks require), in the machine's own layout
_WHOLE_FILE_WRITE_LOCK = struct.pack("@hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)


class UnsafeDirectory(Exception):
    """A state directory this user does not alone control; the message says how to fix it."""


def private_directory(directory: Path) -> Path:
    """`directory`, created owner-only when missing. An existing one must be a directory
    (not a link to one), owned by this user and writable by no one else (UnsafeDirectory
    otherwise); one readable by others is made owner-only."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        directory.mkdir(mode=DIRECTORY_MODE)
    found = os.lstat(directory)
    if stat.S_ISLNK(found.st_mode):
        raise UnsafeDirectory(f"{directory} is a symbolic link; give a real directory")
    if not stat.S_ISDIR(found.st_mode):
        raise UnsafeDirectory(f"{directory} is not a directory")
    if found.st_uid != os.geteuid():
        raise UnsafeDirectory(
            f"{directory} belongs to uid {found.st_uid}, not to this user (uid {os.geteuid()}):"
            " use a directory of your own"
        )
    if found.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeDirectory(
            f"{directory} may be written by others (mode {stat.S_IMODE(found.st_mode):o}): "
            f"chmod 700 it, or use another"
        )
    if stat.S_IMODE(found.st_mode) != DIRECTORY_MODE:
        os.chmod(directory, DIRECTORY_MODE)  # ours, and no one else's to write: close it
    return directory


def open_private(path: Path, flags: int) -> int:
    """A file descriptor of `path`, created 0600 when `flags` create it, never through a
    symbolic link (OSError ELOOP where one stands)."""
    return os.open(path, flags | _NO_LINKS, FILE_MODE)


def read_private(path: Path) -> bytes:
    """The whole of a small file in a private directory."""
    with os.fdopen(open_private(path, os.O_RDONLY), "rb") as file:
        return file.read()


def write_whole(path: Path, data: bytes) -> None:
    """Replace `path` with `data` in one rename: readers never see a partial file."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    with os.fdopen(open_private(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb") as file:
        file.write(data)
    os.replace(temporary, path)


def try_lock(path: Path) -> int | None:
    """An exclusive lock of `path` held through the returned descriptor (closing it
    releases the lock, as the process's death does); None while another handle holds one."""
    fd = open_private(path, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _WHOLE_FILE_WRITE_LOCK)
    except OSError:
        os.close(fd)
        return None
    return fd


def private_file(path: Path) -> None:
    """Make an existing file of this user's owner-only (a database made before it was);
    a link, or another user's file, is left as it is."""
    found = os.lstat(path)
    mine = stat.S_ISREG(found.st_mode) and found.st_uid == os.geteuid()
    if mine and stat.S_IMODE(found.st_mode) & 0o077:
        os.chmod(path, FILE_MODE)
