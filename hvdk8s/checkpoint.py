"""Checkpoint files: written by one process atomically, read back newest-valid-first.

Framework-neutral: the caller passes how to write and read one file (torch.save/torch.load, or a
Keras/TensorFlow equivalent). A checkpoint is `epoch-00007.ckpt`; it becomes visible under that name
only after it is fully written and fsynced, so a crash mid-write never leaves a half file that looks
finished. Reading skips files that fail to load (e.g. damaged by hand) and falls back to older ones.
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any, Callable, Optional

from hvdk8s.core.atomic import atomic_path, is_part, unwritable_reason

_NAME = re.compile(r"^epoch-(\d{5,})\.ckpt$")


def path_for(directory: str | os.PathLike, epoch: int) -> Path:
    return Path(directory) / f"epoch-{epoch:05d}.ckpt"


def list_checkpoints(directory: str | os.PathLike) -> list[tuple[int, Path]]:
    """(epoch, path) of finished checkpoint files, newest first."""
    d = Path(directory)
    if not d.is_dir():
        return []
    found = [(int(m.group(1)), d / p.name) for p in d.iterdir() if (m := _NAME.match(p.name))]
    return sorted(found, reverse=True)


def check_writable(directory: str | os.PathLike) -> Optional[str]:
    """Why checkpoints cannot be written to `directory` (creating it if needed), or None if they can:
    asked before training starts, not after the first epoch's work."""
    reason = unwritable_reason(directory)
    return None if reason is None else f"cannot write checkpoints to {Path(directory)}: {reason}"


def save(directory: str | os.PathLike, epoch: int, payload: Any, write: Callable[[Any, Path], None],
         keep: int = 3) -> Path:
    """Write `payload` as the checkpoint of `epoch`, then prune: checkpoints of later epochs are from
    an abandoned run (`--no-resume`, or skipped as damaged) and would be resumed instead of this one, so
    they go; of the rest, the `keep` newest stay, this one always among them. Temporary files left by
    a writer that was killed mid-write go too (one job writes a directory, from rank 0 only)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    for leftover in d.iterdir():
        if is_part(leftover.name):
            leftover.unlink(missing_ok=True)
    final = path_for(d, epoch)
    with atomic_path(final) as tmp:
        write(payload, tmp)
    current = [(e, p) for e, p in list_checkpoints(d) if e <= epoch]
    stale = [p for e, p in list_checkpoints(d) if e > epoch] + [p for _, p in current[keep:]]
    for old in stale:
        old.unlink(missing_ok=True)
    return final


def load_latest(directory: str | os.PathLike, read: Callable[[Path], Any],
                valid: Callable[[Any], bool] = lambda _: True) -> Optional[tuple[int, Path, Any]]:
    """(epoch, path, payload) of the newest checkpoint that loads and passes `valid`, or None."""
    for epoch, path in list_checkpoints(directory):
        try:
            payload = read(path)
        except Exception as e:  # a damaged file: say so, then try the next older one
            print(f"hvdk8s: skipping unreadable checkpoint {path}: {type(e).__name__}: {e}", file=sys.stderr)
            continue
        if valid(payload):
            return epoch, path, payload
        print(f"hvdk8s: skipping checkpoint {path}: not a checkpoint of this job", file=sys.stderr)
    return None
