"""The cache as a whole: which datasets it holds, which are in use, and removing them.

A running job holds its dataset with a shared flock on `<key>/.hold`; eviction takes that lock (and the
sync lock) exclusively without waiting, so a dataset in use or being synced is never removed. A sync may
also lease its dataset for a while (`<key>/.lease`, for a job whose ranks take their hold only later, as
on a cluster, where an init container syncs and exits): until the lease ends, eviction treats the
dataset as held; an expired lease counts for nothing. Removal renames the dataset to a trash name first:
a half-deleted dataset never sits under its key.
"""
from __future__ import annotations

import datetime
import os
import secrets
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from . import locks
from .errors import CacheError
from .keys import check_key, dataset_key
from .layout import DatasetDir
from .sizes import format_size

TRASH_PREFIX = ".trash-"


@dataclass(frozen=True)
class CachedDataset:
    key: str
    source: str | None
    bytes: int
    files: int
    last_used: float
    complete: bool
    held: bool                       # a job holds it (a shared flock on .hold) right now
    leased_until: float | None = None  # the end of an unexpired lease (seconds since the epoch)
    version: str | None = None         # the dataset version it was synced as (`sync(version=...)`)


def cached_path(source: str, cache_root: str | os.PathLike, version: str | None = None) -> Path | None:
    """`<root>/<key>/data` if that dataset is completely synced, else None."""
    ds = DatasetDir(Path(cache_root), dataset_key(source, version))
    return ds.data if ds.manifest_path.exists() else None


class Hold:
    """A dataset kept from eviction: a shared flock on its `.hold`, released by `release()` (or leaving a
    `with` block) or by the kernel when the process ends, and deliberately not by garbage collection, so
    that a launcher which drops it still holds the dataset until its ranks, its children, have finished."""

    def __init__(self, ds: DatasetDir, fd: int):
        self.path = ds.data
        self._ds = ds
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            self._ds.touch_used()
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> Path:
        return self.path

    def __exit__(self, *exc: object) -> None:
        self.release()


def take_hold(ds: DatasetDir) -> Hold:
    """Hold `ds` (marking it used). To leave no moment in which a fresh dataset can be evicted, a sync
    takes this while it still has the dataset's sync lock, which eviction needs too."""
    fd, _ = locks.acquire_shared(ds.hold_path)
    ds.touch_used()
    return Hold(ds, fd)


@contextmanager
def hold(cache_root: str | os.PathLike, key: str) -> Iterator[Path]:
    """Keep dataset `key` from eviction while the block runs (a shared lock that dies with the process);
    marks it used on entry and exit. Yields its data directory."""
    with take_hold(DatasetDir(Path(cache_root), check_key(key))) as data:
        yield data


def format_time(ts: float) -> str:
    """A time as people read it in messages and `cache ls`: local, with its zone."""
    return datetime.datetime.fromtimestamp(ts).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")


def _lease_end(ds: DatasetDir) -> float | None:
    """The end of the dataset's lease if it has not passed yet, else None."""
    until = ds.read_lease()
    return until if until is not None and until > time.time() else None


def leased_until(cache_root: str | os.PathLike, key: str) -> float | None:
    """Until when dataset `key` is leased (kept from eviction as if held), or None if it is not (any more)."""
    return _lease_end(DatasetDir(Path(cache_root), check_key(key)))


def _is_held(ds: DatasetDir) -> bool:
    fd = locks.try_exclusive(ds.hold_path)
    if fd is None:
        return True
    os.close(fd)
    return False


def _describe(ds: DatasetDir) -> CachedDataset:
    manifest = ds.read_manifest()
    if manifest is not None:
        source, version = manifest.source, manifest.version
        nbytes, nfiles = manifest.total_bytes, len(manifest.files)
    else:
        on_disk, parts = ds.scan()
        source, version = ds.read_source()
        nbytes = sum(st.st_size for st in on_disk.values()) + sum(p.stat().st_size for p in parts if p.exists())
        nfiles = len(on_disk)
    return CachedDataset(key=ds.key, source=source, bytes=nbytes, files=nfiles, last_used=ds.last_used(),
                         complete=manifest is not None, held=_is_held(ds), leased_until=_lease_end(ds),
                         version=version)


def _purge_trash(root: Path) -> None:
    for p in root.glob(TRASH_PREFIX + "*"):
        shutil.rmtree(p, ignore_errors=True)  # an earlier eviction died before deleting it


def list_datasets(cache_root: str | os.PathLike) -> list[CachedDataset]:
    """Every dataset under the root, complete or not, sorted by key."""
    root = Path(cache_root)
    if not root.is_dir():
        return []
    _purge_trash(root)
    out = []
    for p in sorted(root.iterdir()):
        if p.is_dir() and not p.name.startswith("."):
            try:
                out.append(_describe(DatasetDir(root, p.name)))
            except FileNotFoundError:
                continue  # evicted while we looked
    return out


def _evict_one(root: Path, key: str, only_if_empty: bool = False) -> bool:
    """Remove dataset `key` unless a job holds it, a sync is writing it or an unexpired lease keeps it (or,
    with `only_if_empty`, unless anything was synced into it). The lease is read under the sync lock,
    under which a sync writes it: a sync that just finished has leased its dataset before we look."""
    ds = DatasetDir(root, key)
    hold_fd = locks.try_exclusive(ds.hold_path)
    if hold_fd is None:
        return False
    try:
        lock_fd = locks.try_exclusive(ds.lock_path)
        if lock_fd is None:
            return False
        try:
            if _lease_end(ds) is not None:
                return False
            if only_if_empty and (ds.data.exists() or ds.journal_path.exists() or ds.manifest_path.exists()):
                return False
            trash = root / f"{TRASH_PREFIX}{key}-{secrets.token_hex(4)}"
            os.rename(ds.path, trash)
        finally:
            os.close(lock_fd)
    finally:
        os.close(hold_fd)
    shutil.rmtree(trash, ignore_errors=True)
    return True


def discard_if_empty(cache_root: Path, key: str) -> None:
    """Remove the directory a failed first sync created, so a mistyped source leaves no trace."""
    _evict_one(cache_root, key, only_if_empty=True)


def evict(cache_root: str | os.PathLike, *, keys: list[str] | None = None,
          quota_bytes: int | None = None) -> list[str]:
    """Remove the datasets named by `keys`, then, with a quota, least recently used ones until the cache
    holds at most `quota_bytes`. Held, leased or syncing datasets stay. Returns the keys removed."""
    root = Path(cache_root)
    if not root.is_dir():
        raise CacheError(f"{root}: no such cache directory")
    removed = []
    for key in keys or []:
        if not (root / check_key(key)).is_dir():
            raise CacheError(f"{root}: no dataset {key!r} here; `hvdk8s cache ls {root}` lists them")
        if _evict_one(root, key):
            removed.append(key)
    if quota_bytes is not None:
        datasets = list_datasets(root)
        total = sum(d.bytes for d in datasets)
        for d in sorted(datasets, key=lambda d: d.last_used):
            if total <= quota_bytes:
                break
            if not d.held and d.leased_until is None and _evict_one(root, d.key):
                removed.append(d.key)
                total -= d.bytes
    return removed


def make_room(cache_root: Path, key: str, needed: int, quota_bytes: int) -> list[str]:
    """Evict other datasets, least recently used first, until `needed` bytes for `key` fit in the quota;
    held, leased and syncing ones stay, and if they leave too little room, fail saying so."""
    others = [d for d in list_datasets(cache_root) if d.key != key]
    used = sum(d.bytes for d in others)
    removed = []
    for d in sorted(others, key=lambda d: d.last_used):
        if used + needed <= quota_bytes:
            break
        if not d.held and d.leased_until is None and _evict_one(cache_root, d.key):
            removed.append(d.key)
            used -= d.bytes
    if used + needed > quota_bytes:
        leased = [f"{d.key} until {format_time(d.leased_until)}" for d in others
                  if d.leased_until is not None and d.key not in removed]
        raise CacheError(
            f"dataset {key} needs {format_size(needed)} ({needed} bytes) but the cache at {cache_root} has a quota "
            f"of {format_size(quota_bytes)} and {format_size(used)} of it is in datasets in use, leased or being "
            f"synced{' (leased: ' + ', '.join(leased) + ')' if leased else ''}; "
            f"raise the quota to at least {format_size(used + needed)} or free space")
    return removed
