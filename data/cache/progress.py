"""What a sync shows on stderr: a rich progress bar (bytes and files) on a terminal, and always one
summary line at the end, for logs."""
from __future__ import annotations

import sys
import threading
from types import TracebackType

from rich.console import Console
from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                           TransferSpeedColumn)


class SyncProgress:
    def __init__(self, key: str, enabled: bool):
        self.key = key
        self.enabled = enabled
        self._bar: Progress | None = None
        self._task = None
        self._files = 0
        self._total_files = 0
        self._lock = threading.Lock()

    def start(self, files: int, nbytes: int) -> None:
        if not (self.enabled and sys.stderr.isatty() and files):
            return
        self._total_files = files
        self._bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), DownloadColumn(),
                             TransferSpeedColumn(), TextColumn("{task.fields[files]}"), TimeRemainingColumn(),
                             console=Console(stderr=True), transient=True)
        self._task = self._bar.add_task(self.key, total=nbytes, files=f"0/{files} files")
        self._bar.start()

    def advance(self, nbytes: int) -> None:
        if self._bar is not None:
            self._bar.update(self._task, advance=nbytes)

    def file_done(self) -> None:
        if self._bar is not None:
            with self._lock:
                self._files += 1
                self._bar.update(self._task, files=f"{self._files}/{self._total_files} files")

    def stop(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def summary(self, copied: int, skipped: int, nbytes: int, seconds: float) -> None:
        if self.enabled:
            mb = nbytes / 1e6
            rate = mb / seconds if seconds > 0 else 0.0
            print(f"synced {self.key}: {copied} files copied, {skipped} skipped, {mb:.1f} MB in {seconds:.1f} s "
                  f"({rate:.1f} MB/s)", file=sys.stderr, flush=True)

    def __enter__(self) -> "SyncProgress":
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
