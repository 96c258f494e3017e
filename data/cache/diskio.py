"""Crash-safe file primitives: temporary names that never look final, atomic replace, durable renames."""
from __future__ import annotations

import hashlib
import os
import re
import secrets
from pathlib import Path

PART_SUFFIX = ".hvdk8s-part"
_PART = re.compile(r"\..+\.[0-9a-f]{8}" + re.escape(PART_SUFFIX))


def part_path(final: Path) -> Path:
    """A unique hidden name next to `final` (same directory, so the rename into place is atomic)."""
    name = final.name if len(final.name.encode()) <= 200 else hashlib.sha256(final.name.encode()).hexdigest()
    return final.with_name(f".{name}.{secrets.token_hex(4)}{PART_SUFFIX}")  # within NAME_MAX (255)


def is_part(name: str) -> bool:
    return bool(_PART.fullmatch(name))


def fsync_dir(directory: Path) -> None:
    """Make renames in `directory` survive a power cut, not only a killed process."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    """Write `data` so that `path` holds either its old content or all of the new, never a prefix."""
    tmp = part_path(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
