"""What a source publishes about itself: `hvdk8s-manifest.json` at its root (every file's path, size and
sha256; the listing of an HTTP source, which cannot be listed otherwise) and the per-shard sha256 of an
hvdk8s shard `index.json`. Both give the sync checksums to verify copies against."""
from __future__ import annotations

import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath

from .diskio import atomic_write
from .errors import CacheError, plain, shown
from .keys import PUBLISHED_MANIFEST
from .localtree import hash_stable, list_tree

FORMAT = "hvdk8s-manifest"
VERSION = 1
SHARD_INDEX = "index.json"
_SHA256 = re.compile(r"[0-9a-f]{64}")


def check_relative(path: str, where: str) -> str:
    """A path from a source must stay inside the dataset directory, and be UTF-8 (records are JSON)."""
    p = PurePosixPath(path)
    if not path or p.is_absolute() or any(part in ("", ".", "..") for part in path.split("/")) or "\0" in path:
        raise CacheError(f"{where}: unsafe file path {path!r} (paths must be relative, without '..')")
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise CacheError(f"{where}: file path {shown(path)} is not UTF-8; rename the file") from None
    return path


def write_manifest(directory: str | os.PathLike) -> Path:
    """Publish `hvdk8s-manifest.json` at the root of a source directory (written atomically), listing the
    files a sync of it would copy; what a sync would refuse (see `localtree`) is refused here too."""
    root = Path(directory)
    if not root.is_dir():
        raise CacheError(f"{root}: not a directory; give the dataset's source directory")
    listed = sorted(list_tree(str(root)).files, key=lambda f: f.rel)
    with ThreadPoolExecutor(8) as pool:  # hashlib drops the GIL: hashing is parallel
        hashed = list(pool.map(lambda f: hash_stable(f.path), listed))
    files = [{"path": f.rel, "size": size, "sha256": digest} for f, (digest, size) in zip(listed, hashed)]
    doc = {"format": FORMAT, "version": VERSION, "total_bytes": sum(f["size"] for f in files),
           "file_count": len(files), "files": files}
    out = root / PUBLISHED_MANIFEST
    try:
        atomic_write(out, json.dumps(doc, indent=1).encode())
    except OSError as e:  # a read-only source, a full disk, a directory of that name
        raise CacheError(f"{plain(str(out))}: cannot write the manifest ({e.strerror})") from None
    return out


def parse_manifest(data: bytes, where: str) -> dict[str, tuple[int, str]]:
    """{relative path: (size, sha256)} from a published manifest; any defect is a CacheError naming `where`."""
    try:
        doc = json.loads(data)
        if doc.get("format") != FORMAT:
            raise ValueError(f"format is {doc.get('format')!r}, not {FORMAT!r}")
        out: dict[str, tuple[int, str]] = {}
        for i, f in enumerate(doc["files"]):
            size, digest = f["size"], f["sha256"]
            if not isinstance(size, int) or size < 0 or not isinstance(digest, str) or not _SHA256.fullmatch(digest):
                raise ValueError(f"files[{i}] needs an integer size and a 64-hex sha256")
            out[check_relative(f["path"], where)] = (size, digest)
        return out
    except CacheError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise CacheError(f"{where}: not a valid {PUBLISHED_MANIFEST} ({e}); "
                         "regenerate it with `hvdk8s cache manifest DIR`") from None


def shard_checksums(data: bytes, directory: str) -> dict[str, str]:
    """{relative path: sha256} of the shards an hvdk8s shard index in `directory` lists. Anything that
    is not such an index (users may have their own index.json) gives nothing."""
    try:
        doc = json.loads(data)
        if doc.get("format") != "hvdk8s-shards":
            return {}
        prefix = f"{directory}/" if directory else ""
        return {f"{prefix}{s['file']}": s["sha256"] for s in doc["shards"]
                if isinstance(s.get("sha256"), str) and _SHA256.fullmatch(s["sha256"])}
    except (ValueError, KeyError, TypeError, AttributeError):
        return {}
