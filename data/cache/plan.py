"""What a sync has to do: compare the source listing with what the cache recorded (manifest or journal)
and what is on disk. A recorded file is trusted when the source still describes it the same way and
the cached file still has the size and the mtime the cache gave it, so a warm sync hashes nothing."""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from .layout import Entry
from .sources import SourceFile


@dataclass
class Plan:
    keep: dict[str, Entry]          # cached and current: skipped
    copy: list[SourceFile]          # missing, changed at the source, or damaged in the cache
    delete: list[str]               # final-named files the source no longer has
    parts: list[Path]               # temporary files of interrupted copies
    listed: dict[str, SourceFile]

    def unchanged_from(self, recorded: tuple[Entry, ...]) -> bool:
        """Nothing to copy or delete, and the record would be rewritten as it is."""
        return not (self.copy or self.delete or self.parts) and set(recorded) == set(self.keep.values())

    def reject(self, path: str) -> None:
        """A kept file turned out damaged: copy it again."""
        self.keep.pop(path)
        self.copy.append(self.listed[path])

    @property
    def total_bytes(self) -> int:
        return sum(f.size or 0 for f in self.listed.values())


def _describes_same(e: Entry, f: SourceFile) -> bool:
    if f.size is None and f.etag is None and f.mtime is None and f.sha256 is None:
        return False  # the source tells us nothing to compare: fetch it again
    return ((f.size is None or f.size == e.size) and (f.sha256 is None or f.sha256 == e.sha256)
            and f.etag == e.etag and f.mtime == e.mtime)


def _intact(e: Entry, st: os.stat_result | None) -> bool:
    return (st is not None and stat.S_ISREG(st.st_mode) and st.st_size == e.size
            and st.st_mtime_ns == e.cached_mtime_ns)


def make_plan(files: list[SourceFile], recorded: dict[str, Entry], on_disk: dict[str, os.stat_result],
              parts: list[Path]) -> Plan:
    listed = {f.path: f for f in files}
    keep: dict[str, Entry] = {}
    copy: list[SourceFile] = []
    for f in files:
        e = recorded.get(f.path)
        if e is not None and _describes_same(e, f) and _intact(e, on_disk.get(f.path)):
            keep[f.path] = e
        else:
            copy.append(f)
    delete = sorted(p for p in on_disk if p not in listed)
    return Plan(keep=keep, copy=copy, delete=delete, parts=parts, listed=listed)
