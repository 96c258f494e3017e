"""Generated cache sources (issue 12): odd file names, sizes from empty to over a chunk, FIFOs, sockets,
broken and good symlinks, names that are not UTF-8, HTTP URLs with odd characters. `write_manifest` and
`sync` (in-process, for speed; a few through the real CLI) either succeed with every byte equal to the
source or raise CacheError naming the entry or URL (the CLI: exit 2, no traceback), within a time limit."""
from __future__ import annotations

import functools
import hashlib
import http.server
import itertools
import json
import os
import shutil
import socket
import threading
import time
import urllib.parse
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import cli, tally
from hvdk8s.data.cache import CacheError, sync, write_manifest

LIMIT = 20.0  # seconds per call: generous on a shared 2-core machine; a hang is what this catches
MANIFEST = "hvdk8s-manifest.json"
PART = ".hvdk8s-part"
SETTINGS = dict(deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
_counter = itertools.count()


def within(seconds: float, fn, *args, **kwargs):
    """fn's result, or its exception re-raised; fails if it runs longer than `seconds` (a hang stays behind in
    a daemon thread: blocking reads cannot be interrupted, and failing here names the input)."""
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box["error"] = e

    began = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{getattr(fn, '__name__', fn)}{args} still running after {seconds} s"
    slowest = tally("cache: slowest call")
    slowest["ms"] = max(slowest["ms"], int((time.monotonic() - began) * 1000))
    if "error" in box:
        raise box["error"]
    return box["value"]


def shown(name: str) -> tuple[str, ...]:
    """How a message may name an entry: as it is, or by repr when it is not printable UTF-8."""
    return (name, repr(name))


def names_one_of(message: str, names) -> bool:
    return any(s in message for n in names for s in shown(n))


def tree_digests(directory: Path) -> dict[str, str]:
    out = {}
    for dirpath, _dirs, files in os.walk(directory):
        for name in files:
            if name.endswith(PART) or (dirpath == str(directory) and name == MANIFEST):
                continue
            full = os.path.join(dirpath, name)
            with open(full, "rb") as f:
                out[os.path.relpath(full, directory)] = hashlib.sha256(f.read()).hexdigest()
    return out


# -- generated local trees --------------------------------------------------------------------------------------

_odd = st.sampled_from(["-rf", ".hidden", " lead", "trail ", "trail.", "new\nline", "tab\there", "%41", "%zz",
                        "a?b", "a#b", "a b", "back\\slash", "quote'\"", "é", "日本語", "🙂", "\u200b", "x" * 250,
                        "index.json", "CON", "*", "[a]", "~"])
_chars = st.characters(blacklist_categories=("Cs",), blacklist_characters="/\0")
_component = (_odd | st.text(_chars, min_size=1, max_size=12)).filter(
    lambda s: s not in (".", "..", MANIFEST) and len(s.encode()) <= 250 and not s.endswith(PART))
_size = st.integers(0, 5000) | st.sampled_from([0, 1, (1 << 20) - 1, 1 << 20, (1 << 20) + 1])
_kind = st.sampled_from(["file"] * 6 + ["fifo", "socket", "dangling", "link", "link", "dirlink", "dirlink", "badname"])
_entries = st.lists(st.tuples(st.lists(_component, min_size=1, max_size=3), _kind, _size), min_size=1, max_size=7)


def build(src: Path, entries) -> None:
    """Make the entries that fit (an entry under an earlier file, or a second directory link, is dropped:
    one link to a directory that is not its ancestor cannot form a loop; loops have their own test)."""
    src.mkdir(parents=True)
    made: list[str] = []
    dirlinks = 0
    for i, (parts, kind, size) in enumerate(entries):
        path = src / "/".join(parts)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if os.path.lexists(path):
                continue
            if kind == "file" or (kind in ("link", "dirlink") and not made):
                data = hashlib.sha256(f"{i}".encode()).digest() * (size // 32 + 1)
                path.write_bytes(data[:size])
                made.append(str(path))
            elif kind == "fifo":
                os.mkfifo(path)
            elif kind == "socket":
                if len(os.fsencode(path)) < 100:  # AF_UNIX paths are short
                    with socket.socket(socket.AF_UNIX) as s:
                        s.bind(str(path))
            elif kind == "dangling":
                os.symlink(f"missing-{i}", path)
            elif kind == "link":
                os.symlink(made[i % len(made)], path)
            elif kind == "dirlink":
                target = Path(made[i % len(made)]).parent
                if dirlinks or target == path.parent or target in path.parents:
                    continue
                os.symlink(target, path)
                dirlinks += 1
            elif kind == "badname":
                with open(os.fsencode(path) + b"\xff", "wb") as f:
                    f.write(b"z" * (size % 97))
        except OSError:
            continue  # a name too long with its suffix, or a parent that is a file: not a tree we can make


def expected(src: Path) -> tuple[dict[str, str], list[str]]:
    """The oracle: ({relative path: sha256} a sync must copy, entries it must refuse), read with os.walk
    following links, independently of the cache's own listing."""
    files: dict[str, str] = {}
    bad: list[str] = []
    for dirpath, _dirs, names in os.walk(src, followlinks=True):
        for name in names:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, src)
            try:
                name.encode()
            except UnicodeEncodeError:
                bad.append(rel)
                continue
            if dirpath == str(src) and name == MANIFEST:
                continue
            if os.path.isfile(full):  # follows links; a dangling link, FIFO or socket is not a file
                with open(full, "rb") as f:
                    files[rel] = hashlib.sha256(f.read()).hexdigest()
            else:
                bad.append(rel)
    return files, bad


def check_local(src: Path, cache: Path, manifest_first: bool) -> None:
    """Publishing a manifest first makes the sync verify against it; without one, the sync checks that
    each file stayed one version while read (which waits for freshly written files to settle)."""
    truth, bad = expected(src)
    if not truth and not bad:
        return  # an empty source is refused for being empty, elsewhere
    for step in ("manifest", "sync") if manifest_first else ("sync", "manifest"):
        tally(f"cache: local {step}")["tried"] += 1
        try:
            if step == "manifest":
                within(LIMIT, write_manifest, src)
            else:
                result = within(LIMIT, sync, str(src), cache, workers=2)
        except CacheError as e:
            assert bad, f"{step} refused a tree of regular files: {e}"
            assert names_one_of(str(e), bad), f"{step}: {e} names none of {bad}"
            if step == "manifest":
                assert not (src / MANIFEST).exists()
            else:
                assert not cache.exists() or not any(cache.iterdir()), "a refused sync left files behind"
            tally(f"cache: local {step}")["refused"] += 1
        else:
            assert not bad, f"{step} accepted {bad}"
            if step == "manifest":
                doc = json.loads((src / MANIFEST).read_text())
                assert {f["path"]: f["sha256"] for f in doc["files"]} == truth
            else:
                assert tree_digests(result.path) == truth
            tally(f"cache: local {step}")["accepted"] += 1
            if step == "sync" and not manifest_first:
                tally("cache: local sync")["accepted without a published manifest"] += 1


@settings(max_examples=80, **SETTINGS)
@given(entries=_entries)
def test_generated_local_sources_copy_exactly_or_are_refused_by_name(tmp_path, entries):
    n = next(_counter)
    work = tmp_path / f"ex{n}"
    build(work / "src", entries)
    try:
        check_local(work / "src", work / "cache", manifest_first=n % 4 != 0)
        tally("cache: local sources")["tried"] += 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


# -- generated HTTP sources ----------------------------------------------------------------------------------

class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        pass  # odd URLs make http.server's own handler raise (a NUL in the path): the client sees an error


@pytest.fixture(scope="module")
def www(tmp_path_factory):
    root = tmp_path_factory.mktemp("www")
    server = _Server(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


_spelling = st.sampled_from(["quoted", "quoted/", "quoted manifest", "raw", "raw/", "single file quoted",
                             "single file raw"])


@settings(max_examples=50, **SETTINGS)
@given(dirname=_component, entries=st.lists(st.tuples(st.lists(_component, min_size=1, max_size=2), _size),
                                            min_size=1, max_size=4), spelling=_spelling)
def test_generated_http_urls_copy_exactly_or_fail_naming_the_url(www, tmp_path, dirname, entries, spelling):
    root, base = www
    n = next(_counter)
    served = root / f"d{n}-{dirname}"
    build(served, [(parts, "file", size) for parts, size in entries])
    files, _ = expected(served)
    if not files:
        return
    write_manifest(served)
    name = served.name
    if spelling.startswith("single file"):
        rel = sorted(files)[0]
        name = f"{served.name}/{rel}"
    quoted = urllib.parse.quote(name)
    url = f"{base}/{quoted if 'quoted' in spelling else name}" + ("/" if spelling.endswith("/") else "")
    if spelling == "quoted manifest":
        url += f"/{MANIFEST}"
    cache = tmp_path / f"cache{n}"
    try:
        result = within(LIMIT, sync, url, cache, workers=2, io_timeout=5, stall_timeout=10)
    except CacheError as e:
        message = str(e)
        assert names_one_of(message, [url, base]), f"{message!r} does not name {url!r}"
        assert "raw" in spelling, f"a correctly quoted URL failed: {message}"
        tally("cache: http urls")["refused"] += 1
    else:
        got = tree_digests(result.path)
        if spelling.startswith("single file"):
            assert list(got.values()) == [files[rel]]
        else:
            assert got == files
        tally("cache: http urls")["accepted"] += 1
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(served, ignore_errors=True)
    tally("cache: http urls")["tried"] += 1


_url_tail = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30) | _odd
_authority = st.sampled_from(["{host}", "127.0.0.1:1", "127.0.0.1:0", "127.0.0.1:99999", "127.0.0.1:port",
                              "user:pw@{host}", "[::1]:1", "127.0.0.1:{port}:9"])


@settings(max_examples=50, **SETTINGS)
@given(authority=_authority, tail=_url_tail, scheme=st.sampled_from(["http", "https", "HTTP"]))
def test_odd_url_strings_fail_naming_the_url_or_copy(www, tmp_path, authority, tail, scheme):
    """Whatever follows the scheme (loopback only: nothing here may wait on DNS or a remote host)."""
    _, base = www
    host = base.split("//", 1)[1]
    url = f"{scheme}://{authority.format(host=host, port=host.rsplit(':', 1)[1])}/{tail}"
    cache = tmp_path / f"cache{next(_counter)}"
    tally("cache: odd url strings")["tried"] += 1
    try:
        within(LIMIT, sync, url, cache, io_timeout=5, stall_timeout=10)
        tally("cache: odd url strings")["accepted"] += 1
    except CacheError as e:
        assert names_one_of(str(e), [url]), f"{str(e)!r} does not name {url!r}"
        tally("cache: odd url strings")["refused"] += 1
    finally:
        shutil.rmtree(cache, ignore_errors=True)


# -- a few through the real command line -------------------------------------------------------------------

@settings(max_examples=4, **SETTINGS)
@given(entries=_entries.filter(lambda es: any(k != "file" for _, k, _ in es)))
def test_generated_sources_through_the_cli_exit_0_or_2_without_a_traceback(tmp_path, entries):
    work = tmp_path / f"cli{next(_counter)}"
    build(work / "src", entries)
    _, bad = expected(work / "src")
    try:
        for args in (("cache", "manifest", work / "src"), ("cache", "sync", work / "src", work / "cache")):
            began = time.monotonic()
            proc = cli(*args, timeout=60)
            assert time.monotonic() - began < 30 and "Traceback" not in proc.stderr, proc.stderr
            if bad:
                assert proc.returncode == 2 and names_one_of(proc.stderr, bad), proc.stderr
            else:
                assert proc.returncode == 0, proc.stderr
            counts = tally("cache: through the cli")
            counts["tried"] += 1
            counts["accepted" if proc.returncode == 0 else "refused"] += 1
    finally:
        shutil.rmtree(work, ignore_errors=True)

