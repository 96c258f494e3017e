"""Copy one source file into the cache: stream it in chunks under a temporary name in the destination's
directory, hash while copying, fsync, and rename into place only once it checks out against what the
source promised (published sha256, S3 MD5 ETag, else size). A killed copy leaves at most a hidden part."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import BinaryIO, Callable

from .diskio import part_path
from .errors import CacheError
from .layout import Entry
from .sources import Source, SourceFile

CHUNK = 1 << 20


class _Retry(Exception):
    """A copy attempt that came out wrong or could not read the source: worth another try."""


def fetch(source: Source, f: SourceFile, dest: Path, *, retries: int,
          advance: Callable[[int], None] = lambda n: None) -> Entry:
    """Copy `f` to `dest`, trying again up to `retries` times when the bytes are wrong or the read fails."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    problem = ""
    for _ in range(retries + 1):
        tmp = part_path(dest)
        try:
            digest = _download(source, f, tmp, advance)
            os.replace(tmp, dest)
        except _Retry as e:
            problem = str(e)
            continue
        finally:
            tmp.unlink(missing_ok=True)
        st = dest.stat()
        return Entry(path=f.path, size=st.st_size, sha256=digest, etag=f.etag, mtime=f.mtime,
                     cached_mtime_ns=st.st_mtime_ns)
    raise CacheError(f"{f.path}: {problem} (tried {retries + 1} times from {f.url}); the source is wrong or "
                     "changing: fix the file or republish its checksums, then sync again")


def _download(source: Source, f: SourceFile, tmp: Path, advance: Callable[[int], None]) -> str:
    """Copy into `tmp` and return its sha256 once it verifies; raise _Retry when it does not."""
    sha = hashlib.sha256()
    md5 = hashlib.md5(usedforsecurity=False) if f.md5 else None
    size = 0
    try:
        out = open(tmp, "wb")
    except OSError as e:
        raise CacheError(f"{tmp.parent}: cannot write the cache ({e})") from None
    with out, _open(source, f) as src:
        while chunk := _read(src):
            sha.update(chunk)
            if md5:
                md5.update(chunk)
            try:
                out.write(chunk)
            except OSError as e:
                raise CacheError(f"{tmp.parent}: cannot write the cache ({e})") from None
            size += len(chunk)
            advance(len(chunk))
        out.flush()
        os.fsync(out.fileno())
    if f.size is not None and size != f.size:
        raise _Retry(f"got {size} bytes, the source lists {f.size}")
    if f.sha256 and sha.hexdigest() != f.sha256:
        raise _Retry(f"sha256 {sha.hexdigest()} does not match the {f.sha256} the source publishes")
    if md5 and md5.hexdigest() != f.md5:
        raise _Retry(f"MD5 {md5.hexdigest()} does not match the object's ETag {f.md5}")
    return sha.hexdigest()


def _open(source: Source, f: SourceFile) -> BinaryIO:
    try:
        return source.open(f)
    except FileNotFoundError:
        raise CacheError(f"{f.url}: disappeared from the source during the sync; sync again") from None
    except Exception as e:  # network or server trouble, perhaps transient
        raise _Retry(f"opening failed ({type(e).__name__}: {e})") from None


def _read(src: BinaryIO) -> bytes:
    try:
        return src.read(CHUNK)
    except Exception as e:
        raise _Retry(f"reading failed ({type(e).__name__}: {e})") from None
