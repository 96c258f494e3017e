"""The sha256 of a file, read in 1 MiB chunks: what the shard index and the dataset cache's manifests record
and verify. Imports nothing of hvdk8s."""
from __future__ import annotations

import hashlib
import os


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()
