"""`sync`: bring one dataset from its source onto this node's disk, once, verified and resumable.

Under the dataset's exclusive lock: list the source, plan against the manifest (or the journal an
interrupted sync left), copy what is missing or changed in parallel, journal each finished file, then
write the manifest last. While anything changes the manifest is absent, so the dataset never looks
complete with a mix of old and new files; a killed sync resumes from the journal.
"""
from __future__ import annotations

import math
import os
import time
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from hvdk8s.core.digest import sha256_file

from . import locks, store
from .diskio import fsync_dir
from .errors import CacheError
from .keys import check_key, dataset_key, normalize_source
from .layout import DatasetDir, Entry, Journal, Manifest
from .plan import Plan, make_plan
from .progress import SyncProgress
from .sources import Source, SourceFile, open_source
from .timeouts import Timeouts, resolve
from .transfer import fetch


@dataclass(frozen=True)
class SyncResult:
    key: str
    path: Path            # <cache_root>/<key>/data
    files_copied: int
    files_skipped: int
    bytes_copied: int
    seconds: float
    waited: bool          # another process held the sync lock first
    hold: store.Hold | None = None  # with keep_hold: the dataset kept from eviction until released
    leased_until: float | None = None  # with lease_seconds: the end of the dataset's lease


def sync(source: str, cache_root: str | os.PathLike, *, key: str | None = None, version: str | None = None,
         storage_options: dict | None = None, workers: int = 8, verify: bool = False, retries: int = 2,
         progress: bool = False, lock_timeout: float | None = None, quota_bytes: int | None = None,
         io_timeout: float | None = None, stall_timeout: float | None = None,
         keep_hold: bool = False, lease_seconds: float | None = None) -> SyncResult:
    """Sync `source` into `<cache_root>/<key>/data` and return what it took.

    verify: re-hash every cached file and re-fetch those that differ from the manifest (otherwise a
    cached file is trusted on its size and the mtime the cache gave it). quota_bytes: evict least
    recently used datasets not in use to make room, or fail saying how much is needed. io_timeout,
    stall_timeout: how long a source that stops answering is waited for (see `timeouts`; None: the
    environment's or the default). keep_hold: return with the dataset held (`result.hold`), taken before
    the sync lets go of it, so that no eviction can come between the sync and the job that reads it.
    lease_seconds: once synced, and before the sync lets go of it, lease the dataset for this long (an
    existing longer lease stays): eviction keeps it as if held until then, for a job whose ranks take
    their hold later in other processes (a cluster's init container syncs, then exits)."""
    start = time.monotonic()
    if workers < 1 or retries < 0:
        raise CacheError(f"workers must be at least 1 and retries at least 0 (got {workers}, {retries})")
    if lease_seconds is not None and not (math.isfinite(lease_seconds) and lease_seconds >= 0):
        raise CacheError(f"lease_seconds must be a finite number of seconds, at least 0 (got {lease_seconds})")
    limits = resolve(io_timeout, stall_timeout)
    if not _utf8(source):
        raise CacheError(f"{source!r}: the source's path is not UTF-8; rename it or link to it from a UTF-8 path")
    key = check_key(key) if key else dataset_key(source, version)
    ds = DatasetDir(Path(cache_root), key)
    origin = normalize_source(source)
    with SyncProgress(key, progress) as shown:
        try:
            lock = locks.exclusive(ds.lock_path, lock_timeout,
                                   f"another process syncing {key} into {ds.root} (lock {ds.lock_path})")
            with lock as waited:
                copied, skipped, nbytes = _sync_locked(ds, source, origin, version, storage_options, workers,
                                                       verify, retries, quota_bytes, waited, shown, limits)
                ds.write_last_sync(skipped, copied, nbytes, time.monotonic() - start)
                leased = ds.extend_lease(time.time() + lease_seconds) if lease_seconds else None  # under the lock too
                held = store.take_hold(ds) if keep_hold else None  # before the lock goes: no gap
        except OSError as e:  # source-side errors are CacheErrors already: this is the cache's disk
            raise CacheError(f"{ds.path}: cannot write the cache ({e})") from None
        except CacheError:
            store.discard_if_empty(ds.root, key)
            raise
        seconds = time.monotonic() - start
        shown.stop()
        shown.summary(copied, skipped, nbytes, seconds)
    return SyncResult(key=key, path=ds.data, files_copied=copied, files_skipped=skipped, bytes_copied=nbytes,
                      seconds=seconds, waited=waited, hold=held, leased_until=leased)


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # bytes that are not UTF-8, decoded with surrogateescape (PEP 383)
        return False
    return True


def _sync_locked(ds: DatasetDir, source: str, origin: str, version: str | None, storage_options: dict | None,
                 workers: int, verify: bool, retries: int, quota_bytes: int | None, waited: bool,
                 shown: SyncProgress, limits: Timeouts) -> tuple[int, int, int]:
    ds.remove_stale_temps()
    manifest = ds.read_manifest()
    if waited and not verify and manifest and (manifest.source, manifest.version) == (origin, version):
        ds.touch_used()  # the process we waited for has just synced it: reuse without listing again
        return 0, len(manifest.files), 0

    src = open_source(source, storage_options, limits.io)
    recorded = {e.path: e for e in manifest.files} if manifest else ds.read_journal()
    on_disk, parts = ds.scan()
    plan = make_plan(src.files, recorded, on_disk, parts)
    if verify:
        _verify(ds, plan, workers)
    if quota_bytes is not None and plan.copy:  # nothing to copy needs no room
        store.make_room(ds.root, ds.key, plan.total_bytes, quota_bytes)
    if manifest and (manifest.source, manifest.version) == (origin, version) and plan.unchanged_from(manifest.files):
        ds.journal_path.unlink(missing_ok=True)  # left if a sync was killed just after its manifest
        ds.touch_used()
        return 0, len(plan.keep), 0

    # From here files change: the journal (of what stays valid) replaces the manifest as the record.
    ds.write_source(origin, version)
    journal = ds.restart_journal(plan.keep.values())
    ds.manifest_path.unlink(missing_ok=True)
    try:
        _remove(ds, plan)
        entries, nbytes = _copy_all(ds, src, plan.copy, workers, retries, journal, shown, limits)
    finally:
        journal.close()
    done = {**plan.keep, **{e.path: e for e in entries}}
    for directory in _directories(ds.data, done):
        fsync_dir(directory)  # renames and mkdirs are durable before the manifest says so
    ds.write_manifest(Manifest(key=ds.key, source=origin, version=version, synced_at=time.time(),
                               files=tuple(done[p] for p in sorted(done))))
    ds.journal_path.unlink(missing_ok=True)
    ds.touch_used()
    return len(entries), len(plan.keep), nbytes


def _directories(data: Path, paths: dict[str, Entry]) -> set[Path]:
    """`data` and every directory under it that holds one of `paths`."""
    out = {data}
    for rel in paths:
        parent = (data / rel).parent
        while parent not in out:
            out.add(parent)
            parent = parent.parent
    return out


def _verify(ds: DatasetDir, plan: Plan, workers: int) -> None:
    """Re-hash every file the plan would keep; those that differ from their record are copied again."""
    kept = list(plan.keep.values())
    with ThreadPoolExecutor(workers) as pool:
        digests = list(pool.map(lambda e: sha256_file(ds.data / e.path), kept))
    for e, digest in zip(kept, digests):
        if digest != e.sha256:
            plan.reject(e.path)


def _remove(ds: DatasetDir, plan: Plan) -> None:
    """Delete files gone from the source and leftovers of killed copies, then directories left empty."""
    for rel in plan.delete:
        (ds.data / rel).unlink(missing_ok=True)
    for part in plan.parts:
        part.unlink(missing_ok=True)
    if plan.delete:
        for dirpath, _dirs, _files in os.walk(ds.data, topdown=False):
            if Path(dirpath) != ds.data and not os.listdir(dirpath):
                os.rmdir(dirpath)


def _copy_all(ds: DatasetDir, src: Source, files: list[SourceFile], workers: int, retries: int,
              journal: Journal, shown: SyncProgress, limits: Timeouts) -> tuple[list[Entry], int]:
    """Copy in parallel, largest first (so the pool does not end on one big file), journaling each as it
    finishes. On the first failure the files not yet started are dropped; finished ones stay journaled."""
    files = sorted(files, key=lambda f: -(f.size or 0))
    shown.start(len(files), sum(f.size or 0 for f in files))
    entries: list[Entry] = []

    def one(f: SourceFile) -> Entry:
        e = fetch(src, f, ds.data / f.path, retries=retries, advance=shown.advance, timeouts=limits)
        journal.append(e)
        shown.file_done()
        return e

    with ThreadPoolExecutor(workers) as pool:
        futures: list[Future[Entry]] = [pool.submit(one, f) for f in files]
        try:
            wait(futures, return_when=FIRST_EXCEPTION)
        finally:  # a failure (or Ctrl-C) stops files not yet started; running ones finish and journal
            for fut in futures:
                fut.cancel()
        for fut in futures:
            if not fut.cancelled():
                exc = fut.exception()
                if exc is not None:
                    raise exc
                entries.append(fut.result())
    return entries, sum(e.size for e in entries)
