"""One dataset's directory under the cache root, and the records kept in it.

    <root>/<key>/data/...        the synced files, source layout kept
    <root>/<key>/manifest.json   written last, atomically: present iff the dataset is complete
    <root>/<key>/journal.jsonl   files finished by an unfinished sync (one JSON line each)
    <root>/<key>/source.json     what the dataset is synced from (so `ls` names it while incomplete)
    <root>/<key>/last-used       its mtime is when a sync or a job last used the dataset (LRU)
    <root>/<key>/last-sync.json  what the latest sync found in place and copied (ranks export it as metrics)
    <root>/<key>/.lock           exclusive flock while syncing
    <root>/<key>/.hold           shared flocks of running jobs
    <root>/<key>/.lease          until when (seconds since the epoch) a sync leased the dataset to a job
                                 whose ranks take their hold later (see store); eviction keeps it till then
    .../.<name>.<8 hex>.hvdk8s-part   a file being copied (see diskio); never a final name
    <root>/.trash-<key>-<8 hex>  a dataset being evicted (see store)
"""
from __future__ import annotations

import json
import math
import os
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable

from .diskio import atomic_write, is_part

FORMAT = "hvdk8s-cache"
VERSION = 1


@dataclass(frozen=True)
class Entry:
    """One cached file: what the source said about it, its sha256, and the mtime the cache gave it
    when writing it (a warm sync trusts size + that mtime instead of re-hashing)."""
    path: str
    size: int
    sha256: str
    etag: str | None
    mtime: float | None
    cached_mtime_ns: int

    @classmethod
    def from_json(cls, d: dict) -> "Entry":
        return cls(path=str(d["path"]), size=int(d["size"]), sha256=str(d["sha256"]), etag=d.get("etag"),
                   mtime=d.get("mtime"), cached_mtime_ns=int(d["cached_mtime_ns"]))


@dataclass(frozen=True)
class Manifest:
    key: str
    source: str
    version: str | None
    synced_at: float
    files: tuple[Entry, ...]

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.files)


class Journal:
    """Append-only record of finished files. One write(2) per line in O_APPEND mode: a killed process
    leaves whole lines (a torn last line is skipped on reading)."""

    def __init__(self, path: Path):
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()

    def append(self, entry: Entry) -> None:
        line = (json.dumps(asdict(entry), separators=(",", ":")) + "\n").encode()
        with self._lock:
            os.write(self._fd, line)

    def close(self) -> None:
        os.close(self._fd)


class DatasetDir:
    def __init__(self, root: Path, key: str):
        self.root = root
        self.key = key
        self.path = root / key
        self.data = self.path / "data"
        self.manifest_path = self.path / "manifest.json"
        self.journal_path = self.path / "journal.jsonl"
        self.source_path = self.path / "source.json"
        self.used_path = self.path / "last-used"
        self.lock_path = self.path / ".lock"
        self.hold_path = self.path / ".hold"
        self.lease_path = self.path / ".lease"
        self.last_sync_path = self.path / "last-sync.json"

    # -- completeness -------------------------------------------------------------------------------
    def read_manifest(self) -> Manifest | None:
        """The manifest, or None if absent or unreadable (only tampering makes it unreadable: it is
        written atomically; treating it as absent makes the next sync rebuild it)."""
        try:
            d = json.loads(self.manifest_path.read_bytes())
            return Manifest(key=d["key"], source=d["source"], version=d.get("source_version"),
                            synced_at=float(d["synced_at"]),
                            files=tuple(Entry.from_json(f) for f in d["files"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def write_manifest(self, manifest: Manifest) -> None:
        d = {"format": FORMAT, "version": VERSION, "key": manifest.key, "source": manifest.source,
             "source_version": manifest.version, "synced_at": manifest.synced_at,
             "total_bytes": manifest.total_bytes, "file_count": len(manifest.files),
             "files": [asdict(e) for e in manifest.files]}
        atomic_write(self.manifest_path, json.dumps(d, indent=1).encode())

    # -- journal ------------------------------------------------------------------------------------
    def read_journal(self) -> dict[str, Entry]:
        entries: dict[str, Entry] = {}
        try:
            lines = self.journal_path.read_bytes().splitlines()
        except FileNotFoundError:
            return entries
        for line in lines:
            try:
                e = Entry.from_json(json.loads(line))
            except (ValueError, KeyError, TypeError):
                continue  # a line cut short by a kill
            entries[e.path] = e
        return entries

    def restart_journal(self, entries: Iterable[Entry]) -> Journal:
        """Replace the journal with `entries` (the files still valid) and open it for appending."""
        text = "".join(json.dumps(asdict(e), separators=(",", ":")) + "\n" for e in entries)
        atomic_write(self.journal_path, text.encode())
        return Journal(self.journal_path)

    # -- bookkeeping --------------------------------------------------------------------------------
    def write_source(self, source: str, version: str | None) -> None:
        atomic_write(self.source_path, json.dumps({"source": source, "version": version}).encode())

    def read_source(self) -> tuple[str | None, str | None]:
        """What the dataset is synced from and its version: (None, None) where unreadable."""
        try:
            d = json.loads(self.source_path.read_bytes())
            return str(d["source"]), None if d.get("version") is None else str(d["version"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None, None

    def write_last_sync(self, files_hit: int, files_missed: int, bytes_copied: int, seconds: float) -> None:
        atomic_write(self.last_sync_path, json.dumps({"files_hit": files_hit, "files_missed": files_missed,
                                                      "bytes_copied": bytes_copied, "seconds": seconds}).encode())

    def read_last_sync(self) -> dict | None:
        """The latest sync's figures, or None (none recorded, or unreadable: metrics are not worth failing for)."""
        try:
            d = json.loads(self.last_sync_path.read_bytes())
            return {k: int(d[k]) for k in ("files_hit", "files_missed", "bytes_copied")}
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def read_lease(self) -> float | None:
        """When the dataset's lease ends (seconds since the epoch, expired or not), or None without one.
        It is written atomically, so only tampering makes it unreadable or not finite: then it counts as
        absent (no dataset is kept forever by a damaged file)."""
        try:
            until = float(self.lease_path.read_text())
        except (OSError, ValueError, UnicodeDecodeError):
            return None
        return until if math.isfinite(until) else None

    def extend_lease(self, until: float) -> float:
        """Lease the dataset until `until` unless it is leased longer already (a lease is never
        shortened); returns the lease's end. The caller holds the sync lock, which eviction takes too."""
        current = self.read_lease()
        if current is not None and current >= until:
            return current
        atomic_write(self.lease_path, f"{until!r}\n".encode())  # repr: read back exactly
        return until

    def touch_used(self) -> None:
        self.used_path.touch()  # sets the mtime to now when the file exists already

    def last_used(self) -> float:
        for p in (self.used_path, self.path):
            try:
                return p.stat().st_mtime
            except FileNotFoundError:
                continue
        return 0.0

    def remove_stale_temps(self) -> None:
        """Temporary files of this directory's records (manifest, journal) left by a killed sync."""
        for p in self.path.iterdir():
            if is_part(p.name):
                p.unlink(missing_ok=True)

    def scan(self) -> tuple[dict[str, os.stat_result], list[Path]]:
        """Every file under data/: final-named ones by relative path with their stat, and leftover
        temporary parts of interrupted copies."""
        files: dict[str, os.stat_result] = {}
        parts: list[Path] = []
        base = len(str(self.data)) + 1
        for dirpath, _dirs, names in os.walk(self.data):
            for name in names:
                full = os.path.join(dirpath, name)
                if is_part(name):
                    parts.append(Path(full))
                else:
                    files[full[base:].replace(os.sep, "/")] = os.stat(full, follow_symlinks=False)
        return files, parts
