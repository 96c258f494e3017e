"""Copy one source file into the cache: stream it in chunks under a temporary name in the destination's
directory, hash while copying, fsync, and rename into place only once it checks out against what the
source promised (published sha256, S3 MD5 ETag, else size) and the source says the file did not change
while it was read. A killed copy leaves at most a hidden part.

A source that stops sending is bounded (see `timeouts`): the time a file goes without new bytes is
summed over its attempts, and each attempt may wait only what is left of `stall_timeout`."""
from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import BinaryIO, Callable

from .diskio import part_path
from .errors import CacheError, plain
from .layout import Entry
from .sources import Source, SourceFile
from .timeouts import IO_ENV, STALL_ENV, Timeouts, resolve

CHUNK = 1 << 20


class _Retry(Exception):
    """A copy attempt that came out wrong or could not read the source: worth another try. `stalled`:
    the seconds it waited at its end without receiving a byte."""

    def __init__(self, message: str, stalled: float = 0.0):
        super().__init__(message)
        self.stalled = stalled


def fetch(source: Source, f: SourceFile, dest: Path, *, retries: int,
          advance: Callable[[int], None] = lambda n: None, timeouts: Timeouts | None = None) -> Entry:
    """Copy `f` to `dest`, trying again up to `retries` times when the bytes are wrong, the file changed
    while read, or the read failed; a source that keeps stalling fails the file after `timeouts.stall`."""
    limits = timeouts or resolve(None, None)
    dest.parent.mkdir(parents=True, exist_ok=True)
    problem, stalled, attempts = "", 0.0, 0
    while attempts <= retries and stalled < limits.stall:
        attempts += 1
        tmp = part_path(dest)
        try:
            digest = _download(source, f, tmp, advance, min(limits.io, limits.stall - stalled))
            os.replace(tmp, dest)
        except _Retry as e:
            problem = str(e)
            stalled += e.stalled
            continue
        finally:
            tmp.unlink(missing_ok=True)
        st = dest.stat()
        return Entry(path=f.path, size=st.st_size, sha256=digest, etag=f.etag, mtime=f.mtime,
                     cached_mtime_ns=st.st_mtime_ns)
    if stalled >= limits.stall:
        raise CacheError(f"{plain(f.url)}: no data for {limits.stall:g} s over {attempts} attempt(s) ({problem}); "
                         f"the source stopped answering: check it, or raise ${STALL_ENV} (and ${IO_ENV}) "
                         "if it is only slow")
    raise CacheError(f"{plain(f.path)}: {problem} (tried {attempts} times from {plain(f.url)}); the source is "
                     "wrong or changing: fix the file or republish its checksums, or wait until it stops "
                     "changing, then sync again")


def _download(source: Source, f: SourceFile, tmp: Path, advance: Callable[[int], None], timeout: float) -> str:
    """Copy into `tmp` and return its sha256 once it verifies; raise _Retry when it does not."""
    sha = hashlib.sha256()
    md5 = hashlib.md5(usedforsecurity=False) if f.md5 else None
    size = 0
    try:
        out = open(tmp, "wb")
    except OSError as e:
        raise CacheError(f"{tmp.parent}: cannot write the cache ({e})") from None
    last = time.monotonic()  # the last time bytes arrived (or the attempt began)
    with out, _open(source, f, timeout, last) as src:
        while chunk := _read(src, last):
            last = time.monotonic()
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
        # A published checksum already tells one version from a mix; without one, ask the source.
        changed = None if f.sha256 else source.changed(src, sha.hexdigest())
    if changed:
        raise _Retry(changed)
    if f.size is not None and size != f.size:
        raise _Retry(f"got {size} bytes, the source lists {f.size}")
    if f.sha256 and sha.hexdigest() != f.sha256:
        raise _Retry(f"sha256 {sha.hexdigest()} does not match the {f.sha256} the source publishes")
    if md5 and md5.hexdigest() != f.md5:
        raise _Retry(f"MD5 {md5.hexdigest()} does not match the object's ETag {f.md5}")
    return sha.hexdigest()


def _open(source: Source, f: SourceFile, timeout: float, since: float) -> BinaryIO:
    try:
        return source.open(f, timeout)
    except CacheError:
        raise
    except FileNotFoundError:
        raise CacheError(f"{plain(f.url)}: disappeared from the source during the sync; sync again") from None
    except Exception as e:  # network or server trouble, perhaps transient
        raise _Retry(f"opening failed ({_why(e)})", time.monotonic() - since) from None


def _read(src: BinaryIO, since: float) -> bytes:
    try:
        return src.read(CHUNK)
    except Exception as e:
        raise _Retry(f"reading failed ({_why(e)})", time.monotonic() - since) from None


def _why(e: Exception) -> str:
    if isinstance(e, TimeoutError):  # aiohttp's and fsspec's timeouts, whose own text says little
        return "no data within its timeout"
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
