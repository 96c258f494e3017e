"""Crash-safe file primitives: temporary names that never look final, atomic replace, durable renames."""
from __future__ import annotations

# One implementation for the whole package (hvdk8s.core.atomic); the cache keeps importing these names from
# here, and `is_part` recognises the same temporary names every atomic writer uses, for clean-ups.
from hvdk8s.core.atomic import PART_SUFFIX, atomic_write, fsync_dir, is_part, part_path

__all__ = ["PART_SUFFIX", "atomic_write", "fsync_dir", "is_part", "part_path"]
