"""Dataset keys: the directory name a dataset gets under the cache root.

The trainer, the init containers and the launcher each compute the key on their own from the source URL
(plus an optional version), so it is a pure function of that string and never looks at the source.
"""
from __future__ import annotations

import hashlib
import os
import re

from .errors import CacheError

PUBLISHED_MANIFEST = "hvdk8s-manifest.json"
_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def normalize_source(source: str) -> str:
    """The canonical spelling of a source, so that equivalent spellings share one key.

    Local paths become absolute (`file://` dropped), trailing slashes go, and an HTTP(S) URL naming
    `hvdk8s-manifest.json` means the directory that holds it."""
    if source.startswith("file://"):
        source = source[len("file://"):]
    if "://" not in source:
        return os.path.abspath(os.path.expanduser(source))
    scheme, rest = source.split("://", 1)
    scheme = scheme.lower()
    if scheme in ("http", "https") and rest.endswith("/" + PUBLISHED_MANIFEST):
        rest = rest[: -len(PUBLISHED_MANIFEST) - 1]
    return f"{scheme}://{rest.rstrip('/')}"


def _slug(name: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return slug[:48].strip("-") or "dataset"


def dataset_key(source: str, version: str | None = None) -> str:
    """`<basename>-<12 hex of sha256>`: readable in `ls`, unique per source URL and version."""
    norm = normalize_source(source)
    basename = norm.rstrip("/").rsplit("/", 1)[-1]
    # surrogatepass: a path that is not UTF-8 (or a YAML "\udcff") still has a key; sync refuses it later
    digest = hashlib.sha256(f"{norm}\n{version or ''}".encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{_slug(basename)}-{digest}"


def check_key(key: str) -> str:
    """An explicit key must be one plain directory name: no separators, no leading dot (ours)."""
    if not _KEY.fullmatch(key):
        raise CacheError(f"invalid dataset key {key!r}: use letters, digits, '.', '_' and '-', "
                         "starting with a letter or digit (at most 128 characters)")
    return key
