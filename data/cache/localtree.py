"""A local (or NFS) source directory as the cache sees it: its regular files, read so that a file
rewritten while it is copied is noticed, and everything else refused by name.

Listing follows symbolic links (datasets are often assembled from links) and refuses what cannot be
copied as data rather than skipping it, so the cache never silently differs from the source: FIFOs,
sockets and devices (opening a FIFO blocks forever), dangling links, link loops, and names that are not
UTF-8 (the manifest and journal are JSON text). `hvdk8s cache manifest` and `sync` list the same way.
"""
from __future__ import annotations

import hashlib
import os
import stat
import time
from dataclasses import dataclass

from .diskio import is_part
from .errors import CacheError, plain, shown
from .keys import PUBLISHED_MANIFEST

# A file changed this recently may have been rewritten within one tick of its filesystem's clock, which
# stat cannot tell apart, so it is hashed a second time after its copy (as git's "racy" check does) ...
RACY_SECONDS = 2.0
# ... once it has been left alone this long: a writer paused inside a write (the kernel throttles writers
# of many dirty pages for up to 200 ms at a time) leaves a mixed file and no new timestamp until it ends.
SETTLE_SECONDS = 0.5
_SHOWN_PROBLEMS = 8
_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"))


@dataclass(frozen=True)
class LocalFile:
    rel: str                # '/'-separated, relative to the root; a single-file source: its name
    path: str               # what to open
    st: os.stat_result      # at listing time (symbolic links followed)


@dataclass(frozen=True)
class LocalTree:
    files: list[LocalFile]
    published: str | None   # the root's hvdk8s-manifest.json, if any


def kind_of(mode: int) -> str:
    return next((what for test, what in _KINDS if test(mode)), "not a regular file")


def list_tree(root: str) -> LocalTree:
    """Every regular file under `root` (or `root` itself, a file); a CacheError lists what cannot be cached."""
    problems: list[str] = []
    try:
        st = os.stat(root)
    except FileNotFoundError:
        if os.path.islink(root):
            raise CacheError(f"{plain(root)}: a symbolic link to {shown(_target(root))}, "
                             "which does not exist") from None
        raise CacheError(f"{plain(root)}: not found; check the path") from None
    except OSError as e:
        raise CacheError(f"{plain(root)}: cannot read the source ({e.strerror})") from None
    if stat.S_ISREG(st.st_mode):
        name = os.path.basename(root.rstrip("/"))
        _check_name(name, name, problems)
        _refuse(root, problems)
        return LocalTree([LocalFile(name, root, st)], None)
    if not stat.S_ISDIR(st.st_mode):
        raise CacheError(f"{plain(root)}: {kind_of(st.st_mode)}, not a directory or regular file; "
                         "give the dataset's directory")
    files = _walk(root, (st.st_dev, st.st_ino), problems)
    _refuse(root, problems)
    published = None
    for i, f in enumerate(files):
        if f.rel == PUBLISHED_MANIFEST:
            published = files.pop(i).path  # the listing's checksums, not a data file
            break
    return LocalTree(files, published)


def _walk(root: str, ident: tuple[int, int], problems: list[str]) -> list[LocalFile]:
    """Depth first with a stack of its own (no recursion limit), following links to directories; each
    directory carries the (device, inode) of those above it, so a link back up is a loop, not a hang."""
    files: list[LocalFile] = []
    stack: list[tuple[str, str, frozenset[tuple[int, int]]]] = [(root, "", frozenset([ident]))]
    while stack:
        directory, prefix, above = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError as e:
            problems.append(f"{shown(prefix.rstrip('/') or directory)} (cannot be listed: {e.strerror})")
            continue
        for entry in entries:
            rel = prefix + entry.name
            if is_part(entry.name) or not _check_name(entry.name, rel, problems):
                continue  # a half-copied file of some cache is never data
            try:
                st = entry.stat()  # follows symbolic links
            except FileNotFoundError:
                if entry.is_symlink():
                    problems.append(f"{shown(rel)} (a symlink to {shown(_target(entry.path))}, which does not exist)")
                continue  # else: deleted while we listed, so no longer part of the source
            except OSError as e:
                problems.append(f"{shown(rel)} ({'a symlink loop' if entry.is_symlink() else e.strerror})")
                continue
            if stat.S_ISDIR(st.st_mode):
                inode = (st.st_dev, st.st_ino)
                if inode in above:
                    problems.append(f"{shown(rel)} (a symlink loop)")
                else:
                    stack.append((entry.path, rel + "/", above | {inode}))
            elif stat.S_ISREG(st.st_mode):
                files.append(LocalFile(rel, entry.path, st))
            else:
                problems.append(f"{shown(rel)} ({kind_of(st.st_mode)})")
    problems.sort()
    return sorted(files, key=lambda f: f.rel)


def _target(link: str) -> str:
    try:
        return os.readlink(link)
    except OSError:
        return "?"


def _check_name(name: str, rel: str, problems: list[str]) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # undecodable bytes arrive as lone surrogates (PEP 383)
        problems.append(f"{shown(rel)} (a name that is not UTF-8)")
        return False
    return True


def _refuse(root: str, problems: list[str]) -> None:
    if not problems:
        return
    listed = ", ".join(problems[:_SHOWN_PROBLEMS])
    more = f", and {len(problems) - _SHOWN_PROBLEMS} more" if len(problems) > _SHOWN_PROBLEMS else ""
    raise CacheError(f"{plain(root)}: {len(problems)} entr{'y' if len(problems) == 1 else 'ies'} cannot be cached: "
                     f"{listed}{more}; only regular files (and links to them) are data: remove, rename or "
                     "fix these, or sync a directory without them")


class LocalReader:
    """One local file opened for copying. O_NONBLOCK: should a FIFO have replaced the file since the
    listing, opening it returns at once (and is refused) instead of waiting for a writer forever."""

    def __init__(self, path: str):
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        self.path = path
        self.before = os.fstat(fd)
        if not stat.S_ISREG(self.before.st_mode):
            os.close(fd)
            raise CacheError(f"{shown(path)}: {kind_of(self.before.st_mode)} now, not the regular file listed")
        self._file = os.fdopen(fd, "rb", buffering=0)

    def read(self, n: int) -> bytes:
        return self._file.read(n)

    def changed(self, sha256: str) -> str | None:
        """Why the bytes just read may not be one version of the file, or None. The inode's size, mtime
        and ctime must not have moved (ctime: no one can set it back), and a recently changed file must
        hash the same once it has settled."""
        if self.moved():
            return "changed while it was copied (its size or times moved)"
        age = time.time() - self.before.st_ctime_ns / 1e9
        if age >= RACY_SECONDS:
            return None
        time.sleep(min(max(SETTLE_SECONDS - age, 0.0), SETTLE_SECONDS))
        if self._rehash() != sha256 or self.moved():
            return "changed while it was copied (a second read, once it settled, differs)"
        return None

    def moved(self) -> bool:
        """Whether the inode's size, mtime or ctime moved since it was opened."""
        return _version(os.fstat(self._file.fileno())) != _version(self.before)

    def _rehash(self) -> str:
        h = hashlib.sha256()
        fd, offset = self._file.fileno(), 0
        while chunk := os.pread(fd, 1 << 20, offset):
            h.update(chunk)
            offset += len(chunk)
        return h.hexdigest()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> "LocalReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _version(st: os.stat_result) -> tuple[int, int, int]:
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns


def hash_stable(path: str, retries: int = 2) -> tuple[str, int]:
    """(sha256, size) of a local file whose times did not move while it was read, read again while they
    do (to publish checksums: a checksum of a file caught mid-write makes syncs fail, never cache it)."""
    for _ in range(retries + 1):
        h = hashlib.sha256()
        try:
            with LocalReader(path) as reader:
                while chunk := reader.read(1 << 20):
                    h.update(chunk)
                if not reader.moved():
                    return h.hexdigest(), reader.before.st_size
        except OSError as e:  # deleted or made unreadable since the listing
            raise CacheError(f"{shown(path)}: cannot be read ({e.strerror})") from None
    raise CacheError(f"{shown(path)}: changed while it was hashed ({retries + 1} times); publish the manifest "
                     "once the dataset stops changing")
