"""Crash-safe file writes: a file appears under its final name whole, or not at all.

The writer fills a hidden temporary file in the same directory (so the rename into place is atomic),
which is fsynced before the rename and the directory after it: a killed process or a power cut
leaves the old file or the new one, never a prefix. Temporary names end in PART_SUFFIX so that
leftovers of a killed writer are recognisable (`is_part`) by whoever cleans the directory.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
from pathlib import Path
from typing import Iterator, Optional, Union

PART_SUFFIX = ".hvdk8s-part"
_PART = re.compile(r"\..+\.[0-9a-f]{8}" + re.escape(PART_SUFFIX))


def part_path(final: Union[str, os.PathLike]) -> Path:
    """A unique hidden name next to `final` (same directory, so the rename into place is atomic)."""
    final = Path(final)
    name = final.name if len(final.name.encode()) <= 200 else hashlib.sha256(final.name.encode()).hexdigest()
    return final.with_name(f".{name}.{secrets.token_hex(4)}{PART_SUFFIX}")  # within NAME_MAX (255)


def is_part(name: str) -> bool:
    return bool(_PART.fullmatch(name))


def fsync_dir(directory: Union[str, os.PathLike]) -> None:
    """Make renames in `directory` survive a power cut, not only a killed process."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(final: Union[str, os.PathLike], mode: int = 0o644) -> Iterator[Path]:
    """Yield a temporary path for writers that want one (torch.save, np.savez); once the block ends
    normally, the file becomes `final` with permissions `mode`. On any exception it is removed."""
    final = Path(final)
    tmp = part_path(final)
    try:
        yield tmp
        # Reopened: writers given a path have closed their own handle by now.
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.chmod(tmp, mode)  # explicit: files meant for others (GitOps, shared caches) must be readable
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(final.parent)


def atomic_write(path: Union[str, os.PathLike], data: Union[bytes, str], mode: int = 0o644) -> None:
    """Write `data` (str as UTF-8) so that `path` holds either its old content or all of the new."""
    atomic_write_all({path: data}, mode)


def atomic_write_all(files: dict[Union[str, os.PathLike], Union[bytes, str]], mode: int = 0o644) -> None:
    """Write a set of files so that none is replaced unless all could be written: every file is written
    whole under its temporary name first (a full disk or a bad path fails there, leaving the old set and
    no temporary file), then all are renamed into place."""
    with contextlib.ExitStack() as stack:
        for path, data in files.items():
            tmp = stack.enter_context(atomic_path(path, mode))  # renamed when the stack closes normally
            with open(tmp, "wb") as f:
                f.write(data.encode() if isinstance(data, str) else data)


def unwritable_reason(directory: Union[str, os.PathLike]) -> Optional[str]:
    """Why files cannot be written into `directory` (creating it if needed), or None if they can: a
    probe written and removed the way `atomic_write` writes, so asked up front rather than learnt late."""
    d = Path(directory)
    try:
        d.mkdir(parents=True, exist_ok=True)
        atomic_write(d / ".hvdk8s-write-check", b"")
        (d / ".hvdk8s-write-check").unlink()
    except OSError as e:
        return str(e.strerror or e)
    return None
