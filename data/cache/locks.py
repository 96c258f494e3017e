"""flock(2) locks on files inside a dataset directory.

The kernel drops a flock when its holder dies, SIGKILL included, so a crashed sync or job never leaves a
stale lock. Eviction renames a dataset directory away, so after taking a lock we check that the path
still names the file we locked; if not, the lock guards a dataset in the trash and we start over.
"""
from __future__ import annotations

import fcntl
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from .errors import CacheError


def _open(path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)


def _still_current(path: Path, fd: int) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _acquire(path: Path, mode: int, timeout: float | None, what: str) -> tuple[int, bool]:
    """Lock `path` in `mode`, waiting up to `timeout` seconds (None: forever). Returns (fd, waited)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    waited = False
    while True:
        fd = _open(path)
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            waited = True
            try:
                _wait(fd, mode, deadline, what)
            except BaseException:
                os.close(fd)
                raise
        if _still_current(path, fd):
            return fd, waited
        os.close(fd)  # evicted while we waited: lock the fresh directory instead


def _wait(fd: int, mode: int, deadline: float | None, what: str) -> None:
    if deadline is None:
        fcntl.flock(fd, mode)
        return
    pause = 0.01
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise CacheError(f"timed out waiting for {what}") from None
            time.sleep(pause)
            pause = min(pause * 2, 0.2)


@contextmanager
def exclusive(path: Path, timeout: float | None = None, what: str = "a lock") -> Iterator[bool]:
    """Hold an exclusive lock on `path`; yields whether another process held it first."""
    fd, waited = _acquire(path, fcntl.LOCK_EX, timeout, what)
    try:
        yield waited
    finally:
        os.close(fd)


def acquire_shared(path: Path) -> tuple[int, bool]:
    """A shared lock on `path`, waiting as long as it takes; returns (fd, waited). Closing fd releases it."""
    return _acquire(path, fcntl.LOCK_SH, None, "a lock")


def try_exclusive(path: Path) -> int | None:
    """An exclusive lock if nobody holds `path` (shared or exclusive) right now, else None. Never
    creates the dataset directory: a missing one means someone else evicted it."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    if not _still_current(path, fd):
        os.close(fd)
        return None
    return fd
