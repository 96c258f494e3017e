"""Listing and reading a dataset source: a local (or NFS) path (see `localtree`), and through fsspec
s3:// (s3fs) and http(s)://.

S3 settings come from `storage_options` (passed to s3fs.S3FileSystem: key, secret, token,
client_kwargs={"endpoint_url": ...}, ...) or else the environment: AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN (read by botocore) and AWS_ENDPOINT_URL_S3 or
AWS_ENDPOINT_URL (read here, so they work with any botocore). An HTTP(S) source is the URL of a
directory holding `hvdk8s-manifest.json` (or of that file), or else a single file; every request to it
is bounded (see `timeouts`). Both follow HTTP_PROXY, HTTPS_PROXY and NO_PROXY.
"""
from __future__ import annotations

import os
import posixpath
import re
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, BinaryIO, Iterator
from urllib.parse import quote, unquote, urlparse

from .diskio import is_part
from .errors import CacheError, plain
from .keys import PUBLISHED_MANIFEST, normalize_source
from .localtree import LocalReader, list_tree
from .published import SHARD_INDEX, check_relative, parse_manifest, shard_checksums
from .timeouts import IO_ENV, IO_TIMEOUT

_MD5 = re.compile(r"[0-9a-f]{32}")
_S3_HINT = ("; give credentials and the endpoint in storage_options, or set AWS_ACCESS_KEY_ID, "
            "AWS_SECRET_ACCESS_KEY and AWS_ENDPOINT_URL_S3 (or AWS_ENDPOINT_URL)")


@dataclass(frozen=True)
class SourceFile:
    path: str             # relative, '/'-separated: where it lands under <key>/data
    url: str              # what the filesystem opens
    size: int | None      # None only for an HTTP file served without Content-Length
    etag: str | None      # S3 ETag, HTTP ETag or Last-Modified: changes when the file does
    mtime: float | None   # local files
    sha256: str | None    # published by the source: the copy must match it
    md5: str | None       # a plain (single-part) S3 ETag is the object's MD5


class Source:
    def __init__(self, url: str, fs: Any, files: list[SourceFile], open_kwargs: dict[str, Any],
                 pass_size: bool = False):
        self.url = url
        self.fs = fs
        self.files = files
        self._open_kwargs = open_kwargs
        self._pass_size = pass_size  # s3fs takes the listed size and spares a HEAD request per file

    def open(self, f: SourceFile, timeout: float | None = None) -> BinaryIO:
        """`f` for reading; where the source supports it, no connect or read waits over `timeout` seconds."""
        kwargs = dict(self._open_kwargs)
        if self._pass_size and f.size:
            kwargs["size"] = f.size
        return self.fs.open(f.url, "rb", **kwargs)

    def changed(self, handle: BinaryIO, sha256: str) -> str | None:
        """Why the bytes just read from `handle` may not be one version of the file (None: they are, as
        far as this kind of source can tell; published checksums and ETags are checked by the caller)."""
        return None


class HttpSource(Source):
    """One streamed GET a file, with aiohttp's timeouts set for this attempt. The stream is built directly:
    fsspec's `open` would first ask for the size (a request without these timeouts) whenever the listing
    has none or zero, and it takes a `timeout` argument as its own, not aiohttp's."""

    def open(self, f: SourceFile, timeout: float | None = None) -> BinaryIO:
        from fsspec.asyn import sync as run_on_loop
        from fsspec.implementations.http import HTTPStreamFile

        kwargs = dict(self.fs.kwargs)  # the request options of storage_options (headers, auth, ...)
        if timeout is not None:
            kwargs["timeout"] = _client_timeout(timeout)
        session = run_on_loop(self.fs.loop, self.fs.set_session)
        return HTTPStreamFile(self.fs, f.url, mode="rb", loop=self.fs.loop, session=session, **kwargs)


class LocalSource(Source):
    """A directory or file on this machine (or NFS), read without fsspec: see `localtree`."""

    def open(self, f: SourceFile, timeout: float | None = None) -> LocalReader:  # type: ignore[override]
        return LocalReader(f.url)

    def changed(self, handle: LocalReader, sha256: str) -> str | None:  # type: ignore[override]
        return handle.changed(sha256)


def open_source(source: str, storage_options: dict | None = None, io_timeout: float = IO_TIMEOUT) -> Source:
    """List `source` (over HTTP, no request waits longer than `io_timeout` seconds); every failure becomes
    a CacheError that names it."""
    scheme = source.split("://", 1)[0].lower() if "://" in source else "file"
    hint = _S3_HINT if scheme in ("s3", "s3a") else ""
    where = plain(source)
    try:
        if scheme in ("http", "https"):
            return _http_source(source, storage_options or {}, io_timeout)
        if scheme == "file":
            return _local_source(source)
        return _listed_source(source, scheme, storage_options or {})
    except CacheError:
        raise
    except ImportError as e:
        raise CacheError(f"{where}: reading {scheme}:// sources needs {e.name}; "
                         "pip install 'hvdk8s[remote]'") from None
    except FileNotFoundError:
        raise CacheError(f"{where}: not found; check the path or URL{hint}") from None
    except ValueError as e:
        if "protocol" in str(e).lower():
            raise CacheError(f"{where}: unsupported source; use a local path, s3:// or http(s)://") from None
        raise CacheError(f"{where}: cannot list the source ({type(e).__name__}: {e}){hint}") from None
    except Exception as e:  # network, permissions, credentials: the message says which
        raise CacheError(f"{where}: cannot list the source ({type(e).__name__}: {e}){hint}") from None


def _s3_options(options: dict) -> dict:
    opts = dict(options)
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    client_kwargs = dict(opts.get("client_kwargs") or {})
    if endpoint and not opts.get("endpoint_url") and not client_kwargs.get("endpoint_url"):
        client_kwargs["endpoint_url"] = endpoint
        opts["client_kwargs"] = client_kwargs
    opts.setdefault("skip_instance_cache", True)  # a cached instance would list from a stale cache
    return opts


def _listed_source(source: str, scheme: str, options: dict) -> Source:
    import fsspec

    if scheme in ("s3", "s3a"):
        fs = fsspec.filesystem("s3", **_s3_options(options))
        root = fs._strip_protocol(source).rstrip("/")
        open_kwargs = {"block_size": 8 << 20, "cache_type": "readahead"}
    else:  # any other fsspec protocol that is installed (gs://, abfs://, ...), unverified by tests
        fs = fsspec.filesystem(scheme, **options)
        root = fs._strip_protocol(source).rstrip("/")
        open_kwargs = {}

    info = fs.info(root)
    if info.get("type") == "directory":
        found = {name: i for name, i in fs.find(root, detail=True).items() if i.get("type") == "file"}
        rel_of = {name: name[len(root) + 1:] for name in found if name.startswith(root + "/")}
    else:
        found = {root: info}
        rel_of = {root: posixpath.basename(root)}
    is_s3 = scheme in ("s3", "s3a")
    files: dict[str, SourceFile] = {}
    published: bytes | None = None
    for name, rel in rel_of.items():
        if rel.endswith("/"):
            continue  # an object store's "folder" marker (a key ending in '/'), not a file
        if rel == PUBLISHED_MANIFEST:
            published = fs.cat_file(name)  # the listing's checksums, not a data file
            continue
        if is_part(posixpath.basename(rel)):
            continue  # a half-copied file of some other cache, never data
        files[rel] = _describe(name, check_relative(rel, source), found[name], is_s3)
    files = _with_checksums(source, files, published, fs.cat_file)
    return Source(source, fs, list(files.values()), open_kwargs, pass_size=is_s3)


def _local_source(source: str) -> Source:
    root = normalize_source(source)
    tree = list_tree(root)
    files = {f.rel: SourceFile(path=check_relative(f.rel, source), url=f.path, size=f.st.st_size, etag=None,
                               mtime=f.st.st_mtime, sha256=None, md5=None) for f in tree.files}
    published = _read_local(tree.published) if tree.published else None
    return LocalSource(source, None, list(_with_checksums(source, files, published, _read_local).values()), {})


def _read_local(path: str) -> bytes:
    with LocalReader(path) as f:
        return f.read(-1)


def _with_checksums(source: str, files: dict[str, SourceFile], published: bytes | None, cat) -> dict[str, SourceFile]:
    """`files` with the sha256 that the source publishes for them: its manifest, else shard indexes."""
    if not files:
        raise CacheError(f"{source}: no files there; check the path or URL")
    expected: dict[str, str] = {}
    if published is not None:
        expected = {rel: digest for rel, (_, digest) in
                    parse_manifest(published, f"{source}/{PUBLISHED_MANIFEST}").items()}
    for rel in [r for r in files if posixpath.basename(r) == SHARD_INDEX]:
        shards = shard_checksums(cat(files[rel].url), posixpath.dirname(rel))
        expected.update({k: v for k, v in shards.items() if k not in expected})
    return {rel: replace(f, sha256=expected.get(rel)) for rel, f in files.items()}


def _describe(name: str, rel: str, info: dict, is_s3: bool) -> SourceFile:
    etag = info.get("ETag") or info.get("etag")
    etag = etag.strip('"') if isinstance(etag, str) else None
    mtime = info.get("mtime")
    return SourceFile(path=rel, url=name, size=info.get("size"), etag=etag,
                      mtime=float(mtime) if isinstance(mtime, (int, float)) else None, sha256=None,
                      md5=etag if is_s3 and etag and _MD5.fullmatch(etag) else None)


def _client_timeout(seconds: float) -> Any:
    """aiohttp's bounds for one request: connecting, and each wait for data (headers included); no bound
    on the whole request, which may rightly take long for a big file that keeps arriving."""
    import aiohttp

    return aiohttp.ClientTimeout(total=None, connect=None, sock_connect=seconds, sock_read=seconds)


def _http_source(source: str, options: dict, io_timeout: float) -> Source:
    import fsspec

    scheme = source.split("://", 1)[0].lower()
    client_kwargs = dict(options.get("client_kwargs") or {})
    client_kwargs.setdefault("timeout", _client_timeout(io_timeout))  # aiohttp's default waits 5 minutes
    client_kwargs.setdefault("trust_env", True)  # HTTP(S)_PROXY and NO_PROXY, as botocore follows them for S3
    fs = fsspec.filesystem(scheme, **{**options, "client_kwargs": client_kwargs})
    names_manifest = source.endswith("/" + PUBLISHED_MANIFEST)
    manifest_url = source if names_manifest else source.rstrip("/") + "/" + PUBLISHED_MANIFEST
    base = manifest_url[: -len(PUBLISHED_MANIFEST) - 1]
    try:
        with _answered(manifest_url, io_timeout):
            published = fs.cat_file(manifest_url)
    except FileNotFoundError:
        if names_manifest or source.endswith("/"):
            raise CacheError(f"{plain(manifest_url)}: not found; publish the served directory's manifest with "
                             "`hvdk8s cache manifest DIR`") from None
        with _answered(source, io_timeout):
            return _http_file(source, fs)
    listing = parse_manifest(published, manifest_url)
    files = [SourceFile(path=rel, url=f"{base}/{quote(rel)}", size=size, etag=None, mtime=None, sha256=digest,
                        md5=None) for rel, (size, digest) in listing.items()]
    if not files:
        raise CacheError(f"{plain(manifest_url)}: lists no files")
    return HttpSource(source, fs, files, {})


@contextmanager
def _answered(url: str, io_timeout: float) -> Iterator[None]:
    """A request that timed out is a server that stopped answering: say so, naming the URL."""
    try:
        yield
    except TimeoutError:  # aiohttp's ServerTimeoutError and fsspec's FSTimeoutError are TimeoutErrors
        raise CacheError(f"{plain(url)}: no answer for {io_timeout:g} s; the server stopped answering: check it, "
                         f"or raise ${IO_ENV} if it is only slow") from None


def _http_file(url: str, fs: Any) -> Source:
    info = fs.info(url)
    rel = check_relative(unquote(posixpath.basename(urlparse(url).path)) or "data", url)
    f = SourceFile(path=rel, url=url, size=info.get("size"), etag=info.get("ETag") or info.get("Last-Modified"),
                   mtime=None, sha256=None, md5=None)
    return HttpSource(url, fs, [f], {})
