"""The node-local dataset cache against real sources on loopback: a local directory, moto's S3 server and
an HTTP server that counts the bytes it serves. Real files, real processes, real flocks, real SIGKILLs."""
from __future__ import annotations

import collections
import functools
import hashlib
import http.server
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from dataclasses import replace
from pathlib import Path

import pytest

from hvdk8s.data.cache import (CacheError, cached_path, dataset_key, evict, hold, list_datasets, sync,
                               write_manifest)
from conftest import ROOT, cli

HELPERS = Path(__file__).resolve().parent / "cache_helpers"
MANIFEST = "hvdk8s-manifest.json"
PART = ".hvdk8s-part"


# -- datasets -------------------------------------------------------------------------------------------------

def write_tree(root: Path, sizes: dict[str, int], seed: int) -> dict[str, bytes]:
    rng = random.Random(seed)
    files = {rel: rng.randbytes(size) for rel, size in sizes.items()}
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


SMALL_TREE = {"a.bin": 1000, "empty.bin": 0, "dir/b.bin": 70_000, "dir/with space.bin": 123,
              "dir/deep/c.bin": 2_500_000, **{f"many/f{i:02d}.bin": 500 + 97 * i for i in range(20)}}


def digests(directory: Path) -> dict[str, str]:
    """sha256 of every final-named file under `directory` (the cache's temporary parts left out)."""
    out = {}
    for p in directory.rglob("*"):
        if p.is_file() and not p.name.endswith(PART) and p.name != MANIFEST:
            out[p.relative_to(directory).as_posix()] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def manifest_of(result_path: Path) -> dict:
    return json.loads((result_path.parent / "manifest.json").read_text())


def assert_complete_and_correct(data: Path, source_digests: dict[str, str]) -> None:
    assert digests(data) == source_digests
    m = json.loads((data.parent / "manifest.json").read_text())
    assert {f["path"]: f["sha256"] for f in m["files"]} == source_digests
    assert all((data / f["path"]).stat().st_size == f["size"] for f in m["files"])


# -- an HTTP server that counts bytes served per path ---------------------------------------------------------

class _Handler(http.server.SimpleHTTPRequestHandler):
    def do_GET(self) -> None:
        with self.server.lock:
            self.server.gets[self._path()] += 1
        super().do_GET()

    def _path(self) -> str:
        return urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)

    def copyfile(self, source, outputfile) -> None:
        path = self._path()
        if not path.endswith(MANIFEST):
            self.server.gate.wait()  # tests close the gate to hold a sync mid-transfer
        while chunk := source.read(64 << 10):
            outputfile.write(chunk)
            with self.server.lock:
                self.server.served[path] += len(chunk)

    def log_message(self, *args) -> None:
        pass


class CountingServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, directory: Path):
        super().__init__(("127.0.0.1", 0), functools.partial(_Handler, directory=str(directory)))
        self.served: collections.Counter[str] = collections.Counter()
        self.gets: collections.Counter[str] = collections.Counter()
        self.lock = threading.Lock()
        self.gate = threading.Event()
        self.gate.set()
        self.url = f"http://127.0.0.1:{self.server_address[1]}"

    def handle_error(self, request, client_address) -> None:
        pass  # clients the tests kill drop their connections mid-response

    def data_bytes(self) -> int:
        return sum(n for p, n in self.served.items() if not p.endswith(MANIFEST))


@pytest.fixture
def http_root(tmp_path):
    """(directory served, server): the directory is empty; tests put datasets in it."""
    root = tmp_path / "www"
    root.mkdir()
    server = CountingServer(root)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, server
    server.gate.set()
    server.shutdown()
    server.server_close()


# -- moto's S3 server (conftest's s3_endpoint) -------------------------------------------------------------------

S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
          "AWS_EC2_METADATA_DISABLED": "true"}


@pytest.fixture
def s3_bucket(s3_endpoint, request):
    """(boto3 client, bucket, storage_options) for a fresh bucket."""
    import boto3

    client = boto3.client("s3", endpoint_url=s3_endpoint, aws_access_key_id="testing",
                          aws_secret_access_key="testing", region_name="us-east-1")
    bucket = "b-" + hashlib.sha256(request.node.name.encode()).hexdigest()[:12]
    client.create_bucket(Bucket=bucket)
    options = {"key": "testing", "secret": "testing",
               "client_kwargs": {"endpoint_url": s3_endpoint, "region_name": "us-east-1"}}
    return client, bucket, options


def upload(client, bucket: str, prefix: str, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        client.put_object(Bucket=bucket, Key=f"{prefix}/{rel}", Body=data)


# -- keys ------------------------------------------------------------------------------------------------------

def test_dataset_key_depends_only_on_the_url_and_version(tmp_path, monkeypatch):
    k = dataset_key("s3://bucket/datasets/ImageNet_2012/")
    assert k == dataset_key("s3://bucket/datasets/ImageNet_2012")
    assert k.startswith("imagenet-2012-") and len(k.rsplit("-", 1)[1]) == 12
    assert dataset_key("s3://bucket/datasets/ImageNet_2012", "v2") != k
    assert dataset_key("s3://other/datasets/ImageNet_2012") != k
    # an HTTP manifest URL names its directory; nothing is listed (this host does not exist)
    assert dataset_key("http://nowhere.invalid/d/hvdk8s-manifest.json") == dataset_key("http://nowhere.invalid/d/")
    monkeypatch.chdir(tmp_path)
    assert dataset_key("rel/dir") == dataset_key(str(tmp_path / "rel" / "dir"))
    assert set(dataset_key("/x/Weird NAME!!/")) <= set("abcdefghijklmnopqrstuvwxyz0123456789-")


# -- the three sources ---------------------------------------------------------------------------------------

def test_three_sources_give_identical_bytes_and_a_warm_sync_copies_nothing(tmp_path, http_root, s3_bucket):
    src = tmp_path / "src"
    files = write_tree(src, SMALL_TREE, seed=1)
    write_manifest(src)  # HTTP needs it; the local and S3 syncs verify against it too
    truth = digests(src)
    www, server = http_root
    shutil.copytree(src, www / "ds")
    client, bucket, options = s3_bucket
    upload(client, bucket, "ds", {**files, MANIFEST: (src / MANIFEST).read_bytes()})

    cache = tmp_path / "cache"
    sources = [(str(src), None), (f"{server.url}/ds/", None), (f"s3://{bucket}/ds", options)]
    for source, opts in sources:
        first = sync(source, cache, storage_options=opts, workers=4)
        assert first.files_copied == len(files) and first.bytes_copied == sum(SMALL_TREE.values())
        assert_complete_and_correct(first.path, truth)
        assert cached_path(source, cache) == first.path
        assert manifest_of(first.path)["source"] in (str(src), source.rstrip("/"))
        second = sync(source, cache, storage_options=opts)
        assert (second.files_copied, second.files_skipped, second.bytes_copied) == (0, len(files), 0)
    assert len({dataset_key(s) for s, _ in sources}) == 3
    # HTTP: every byte of every file was served exactly once across both syncs
    assert server.data_bytes() == sum(SMALL_TREE.values())
    assert all(server.served[f"/ds/{rel}"] == size for rel, size in SMALL_TREE.items())


def change_tree(root: Path) -> None:
    """Change one file (same size, different bytes), add one, remove one."""
    p = root / "dir/b.bin"
    data = bytearray(p.read_bytes())
    data[100] ^= 0xFF
    p.write_bytes(bytes(data))
    (root / "dir/new.bin").write_bytes(b"new file" * 100)
    (root / "many/f03.bin").unlink()


def test_local_source_changes_copy_only_what_changed(tmp_path):
    src = tmp_path / "src"
    write_tree(src, SMALL_TREE, seed=2)
    cache = tmp_path / "cache"
    first = sync(str(src), cache)
    change_tree(src)
    # a source file's mtime may not move within the clock's resolution: make the change visible
    os.utime(src / "dir/b.bin", ns=(time.time_ns(), time.time_ns() + 10**9))
    again = sync(str(src), cache)
    assert (again.files_copied, again.files_skipped) == (2, len(SMALL_TREE) - 2)
    assert again.bytes_copied == 70_000 + 800
    assert not (first.path / "many/f03.bin").exists()
    assert_complete_and_correct(again.path, digests(src))


def test_http_source_changes_fetch_only_the_changed_file(tmp_path, http_root):
    www, server = http_root
    write_tree(www / "ds", SMALL_TREE, seed=3)
    write_manifest(www / "ds")
    cache = tmp_path / "cache"
    sync(f"{server.url}/ds/{MANIFEST}", cache)  # the manifest's URL names the same dataset
    change_tree(www / "ds")
    write_manifest(www / "ds")
    before = collections.Counter(server.served)
    again = sync(f"{server.url}/ds", cache)
    assert (again.files_copied, again.files_skipped) == (2, len(SMALL_TREE) - 2)
    fetched = {p: n - before[p] for p, n in server.served.items() if n != before[p] and not p.endswith(MANIFEST)}
    assert fetched == {"/ds/dir/b.bin": 70_000, "/ds/dir/new.bin": 800}
    assert not (again.path / "many/f03.bin").exists()
    assert_complete_and_correct(again.path, digests(www / "ds"))


def test_http_single_file_url(tmp_path, http_root):
    www, server = http_root
    (www / "one.tar").write_bytes(b"x" * 5000)
    result = sync(f"{server.url}/one.tar", tmp_path / "cache")
    assert result.files_copied == 1 and (result.path / "one.tar").read_bytes() == b"x" * 5000
    assert sync(f"{server.url}/one.tar", tmp_path / "cache").files_copied == 0  # its ETag/size unchanged


def test_s3_source_changes_copy_only_what_changed(tmp_path, s3_bucket):
    client, bucket, options = s3_bucket
    files = write_tree(tmp_path / "src", SMALL_TREE, seed=4)
    upload(client, bucket, "ds", files)
    client.put_object(Bucket=bucket, Key="ds/dir/", Body=b"")  # a "folder" as consoles create them
    cache = tmp_path / "cache"
    sync(f"s3://{bucket}/ds/", cache, storage_options=options)
    change_tree(tmp_path / "src")
    client.put_object(Bucket=bucket, Key="ds/dir/b.bin", Body=(tmp_path / "src/dir/b.bin").read_bytes())
    client.put_object(Bucket=bucket, Key="ds/dir/new.bin", Body=(tmp_path / "src/dir/new.bin").read_bytes())
    client.delete_object(Bucket=bucket, Key="ds/many/f03.bin")
    again = sync(f"s3://{bucket}/ds/", cache, storage_options=options)
    assert (again.files_copied, again.files_skipped, again.bytes_copied) == (2, len(SMALL_TREE) - 2, 70_800)
    # single-part uploads: each object's ETag is its MD5, which every copy was checked against
    from hvdk8s.data.cache.sources import open_source

    listed = open_source(f"s3://{bucket}/ds/", options).files
    assert all(f.md5 == hashlib.md5((tmp_path / "src" / f.path).read_bytes()).hexdigest() for f in listed)
    assert_complete_and_correct(again.path, digests(tmp_path / "src"))


def test_s3_settings_from_the_environment_through_the_cli(tmp_path, s3_bucket, s3_endpoint):
    client, bucket, _ = s3_bucket
    upload(client, bucket, "ds", {"x.bin": b"abc" * 1000})
    env = {**S3_ENV, "AWS_ENDPOINT_URL_S3": s3_endpoint}
    proc = cli("cache", "sync", f"s3://{bucket}/ds", tmp_path / "cache", env=env)
    assert proc.returncode == 0, proc.stderr
    assert (Path(proc.stdout.splitlines()[-1]) / "x.bin").read_bytes() == b"abc" * 1000


# -- killed at any instant ------------------------------------------------------------------------------------

KILL_TRIALS = 10


def kill_tree() -> dict[str, int]:
    """A few hundred files of mixed sizes: about 0.6 s for the CLI to sync here with 4 workers."""
    rng = random.Random(11)
    sizes = [rng.randint(0, 16 << 10) for _ in range(600)] + [rng.randint(64 << 10, 256 << 10) for _ in range(180)]
    sizes += [rng.randint(1 << 20, 3 << 20) for _ in range(20)]
    return {f"d{i % 9}/f{i:03d}.bin": s for i, s in enumerate(sizes)}


def journaled(dataset: Path) -> dict[str, int]:
    """The files the journal says are finished (a line cut short by the kill is not a record)."""
    out = {}
    path = dataset / "journal.jsonl"
    for line in (path.read_bytes().splitlines() if path.exists() else []):
        try:
            e = json.loads(line)
        except ValueError:
            continue
        out[e["path"]] = e["size"]
    return out


def test_sigkill_at_random_moments_never_exposes_a_partial_file_and_resumes(tmp_path):
    src = tmp_path / "src"
    sizes = kill_tree()
    write_tree(src, sizes, seed=5)
    truth, total = digests(src), sum(sizes.values())
    key = dataset_key(str(src))

    def start(cache: Path) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "hvdk8s", "cache", "sync", str(src), str(cache),
                                 "--workers", "4"], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    t0 = time.monotonic()
    assert start(tmp_path / "baseline").wait(120) == 0
    duration = time.monotonic() - t0
    shutil.rmtree(tmp_path / "baseline")

    rng = random.Random(1234)
    outcomes: collections.Counter[str] = collections.Counter()
    recopied = []
    for trial in range(KILL_TRIALS):
        cache = tmp_path / f"cache{trial}"
        proc = start(cache)
        if trial % 2:  # a random moment (of the measured run: before, during or after the copy) ...
            time.sleep(rng.uniform(0, duration))
        else:  # ... or once the journal shows a random number of finished files: mid-copy however fast
            journal, wanted = cache / key / "journal.jsonl", rng.randint(1, 300)
            wait_for(lambda: proc.poll() is not None or (journal.exists() and
                                                          journal.read_bytes().count(b"\n") >= wanted),
                     f"{wanted} journaled files")
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        dataset = cache / key
        on_disk = digests(dataset / "data") if (dataset / "data").exists() else {}
        wrong = [rel for rel, d in on_disk.items() if truth.get(rel) != d]
        assert not wrong, f"trial {trial}: final-named files differ from the source: {wrong[:5]}"
        complete = (dataset / "manifest.json").exists()
        if complete:
            assert_complete_and_correct(dataset / "data", truth)
        done = {} if complete else journaled(dataset)
        parts = list(dataset.rglob("*" + PART)) if dataset.exists() else []
        part_bytes = sum(p.stat().st_size for p in parts)
        outcomes["finished" if complete else "mid-copy" if done else "copying, none finished" if parts or on_disk
                 else "before copying"] += 1

        rerun = sync(str(src), cache, workers=4)
        if complete:
            assert (rerun.files_copied, rerun.files_skipped) == (0, len(truth))
        else:  # every journaled file is skipped, and only the others are copied
            assert rerun.files_skipped == len(done)
            assert rerun.bytes_copied == total - sum(done.values())
            # finished files without a journal line: at most the 4 in flight when the kill came
            assert len(set(on_disk) - set(done)) <= 4, f"trial {trial}: finished files were not journaled"
            if len(on_disk) > 4:
                assert rerun.files_skipped > 0
            recopied.append(sum(s for rel, s in sizes.items() if rel in on_disk and rel not in done) + part_bytes)
        checked = sync(str(src), cache, verify=True)
        assert (checked.files_copied, checked.files_skipped) == (0, len(truth))
        assert not list((cache / key).rglob("*" + PART))
        assert_complete_and_correct(checked.path, truth)
        shutil.rmtree(cache)
    assert outcomes["mid-copy"], f"no kill landed mid-copy ({dict(outcomes)}): enlarge kill_tree()"
    print(f"\nSIGKILL trials: {dict(outcomes)}; run {duration:.2f} s; bytes written twice per resumed kill: "
          f"max {max(recopied, default=0)}, total {sum(recopied)} of {total} per sync")


def test_leftovers_of_a_killed_sync_are_cleaned_up(tmp_path):
    """What a SIGKILL can leave at each step (the random kills above hit these only sometimes)."""
    src = tmp_path / "src"
    write_tree(src, SMALL_TREE, seed=13)
    cache = tmp_path / "cache"
    data = sync(str(src), cache).path
    leftovers = [data / "dir/.b.bin.0123abcd.hvdk8s-part", data.parent / ".manifest.json.89abcdef.hvdk8s-part",
                 data.parent / "journal.jsonl"]
    for p in leftovers:
        p.write_bytes(b"partial")
    again = sync(str(src), cache)
    assert again.files_copied == 0 and not any(p.exists() for p in leftovers)
    assert_complete_and_correct(data, digests(src))


# -- damage in the cache, and sources that lie --------------------------------------------------------------

def test_corrupted_cache_files_are_detected_and_repaired(tmp_path):
    src = tmp_path / "src"
    write_tree(src, SMALL_TREE, seed=6)
    cache = tmp_path / "cache"
    data = sync(str(src), cache).path

    def keep_mtime(p: Path, change) -> None:
        st = p.stat()
        change(p)
        os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))  # bit rot does not touch the mtime

    def flip(p: Path) -> None:
        b = bytearray(p.read_bytes())
        b[len(b) // 2] ^= 0x01
        p.write_bytes(bytes(b))

    keep_mtime(data / "dir/deep/c.bin", flip)
    keep_mtime(data / "dir/b.bin", lambda p: os.truncate(p, 1000))
    plain = sync(str(src), cache)  # trusts size + mtime: catches the truncation, cannot see the flip
    assert (plain.files_copied, plain.bytes_copied) == (1, 70_000)
    assert (data / "dir/b.bin").read_bytes() == (src / "dir/b.bin").read_bytes()
    assert (data / "dir/deep/c.bin").read_bytes() != (src / "dir/deep/c.bin").read_bytes()
    verified = sync(str(src), cache, verify=True)
    assert (verified.files_copied, verified.bytes_copied) == (1, 2_500_000)
    assert_complete_and_correct(data, digests(src))


def test_a_source_that_stays_wrong_fails_naming_the_file_and_leaves_no_final_file(tmp_path, http_root):
    www, server = http_root
    write_tree(www / "ds", SMALL_TREE, seed=7)
    manifest = json.loads(write_manifest(www / "ds").read_text())
    for f in manifest["files"]:
        if f["path"] == "dir/with space.bin":
            f["sha256"] = hashlib.sha256(b"something else").hexdigest()
    (www / "ds" / MANIFEST).write_text(json.dumps(manifest))
    cache = tmp_path / "cache"
    with pytest.raises(CacheError, match="dir/with space.bin") as caught:
        sync(f"{server.url}/ds", cache, retries=2)
    assert "tried 3 times" in str(caught.value)
    assert server.gets["/ds/dir/with space.bin"] == 3
    key = dataset_key(f"{server.url}/ds")
    assert not (cache / key / "data/dir/with space.bin").exists()
    assert not list((cache / key).rglob("*" + PART))
    assert cached_path(f"{server.url}/ds", cache) is None
    [listed] = list_datasets(cache)
    assert (listed.key, listed.complete, listed.source) == (key, False, f"{server.url}/ds")
    # republished correctly, the next sync completes and keeps the files the failed one finished
    write_manifest(www / "ds")
    done = len(journaled(cache / key))
    fixed = sync(f"{server.url}/ds", cache)
    assert fixed.files_skipped == done and fixed.files_copied == len(SMALL_TREE) - done
    assert_complete_and_correct(fixed.path, digests(www / "ds"))


def test_a_manifest_path_escaping_the_dataset_is_refused(tmp_path, http_root):
    www, server = http_root
    write_tree(www / "ds", {"a.bin": 10}, seed=12)
    doc = json.loads(write_manifest(www / "ds").read_text())
    doc["files"][0]["path"] = "../../escaped.bin"
    (www / "ds" / MANIFEST).write_text(json.dumps(doc))
    with pytest.raises(CacheError, match=r"unsafe file path '\.\./\.\./escaped.bin'"):
        sync(f"{server.url}/ds", tmp_path / "cache")
    assert not list(tmp_path.rglob("escaped.bin")) and server.data_bytes() == 0


def test_shard_index_checksums_are_verified(tmp_path):
    import numpy as np

    from hvdk8s.data.shards import write_shards

    src = tmp_path / "src"
    write_shards(src / "train", {"x": np.arange(400, dtype=np.float32).reshape(100, 4),
                                 "y": np.arange(100, dtype=np.int64)}, samples_per_shard=25, info={})
    shard = src / "train/shard-00002.npz"
    good = shard.read_bytes()
    bad = bytearray(good)
    bad[-10] ^= 0xFF  # same size: only the index's sha256 can tell
    shard.write_bytes(bytes(bad))
    with pytest.raises(CacheError, match="train/shard-00002.npz"):
        sync(str(src), tmp_path / "cache", retries=1)
    shard.write_bytes(good)
    result = sync(str(src), tmp_path / "cache")
    assert_complete_and_correct(result.path, digests(src))


def test_an_s3_etag_that_does_not_match_is_refetched_then_refused(tmp_path):
    from hvdk8s.data.cache.sources import open_source
    from hvdk8s.data.cache.transfer import fetch

    (tmp_path / "src").mkdir()
    (tmp_path / "src/f.bin").write_bytes(b"payload" * 99)
    source = open_source(str(tmp_path / "src"))
    [f] = source.files
    dest = tmp_path / "out/f.bin"
    with pytest.raises(CacheError, match="f.bin: MD5 .* does not match"):
        fetch(source, replace(f, md5="0" * 32), dest, retries=1)
    assert not dest.exists() and not list(dest.parent.iterdir())
    good = fetch(source, replace(f, md5=hashlib.md5(b"payload" * 99).hexdigest()), dest, retries=0)
    assert dest.read_bytes() == b"payload" * 99 and good.size == 693


# -- concurrency ---------------------------------------------------------------------------------------------

def lock_waiters(lock_file: Path) -> int:
    """Processes blocked in flock(2) on `lock_file`, from the kernel's own table."""
    ino = os.stat(lock_file).st_ino
    return sum(1 for line in Path("/proc/locks").read_text().splitlines()
               if "->" in line and line.split()[-3].endswith(f":{ino}"))


def wait_for(condition, what: str, timeout: float = 300) -> None:  # a watchdog, not a bound
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.02)


def test_four_concurrent_syncs_transfer_each_byte_once(tmp_path, http_root):
    www, server = http_root
    write_tree(www / "ds", SMALL_TREE, seed=8)
    write_manifest(www / "ds")
    cache, source = tmp_path / "cache", f"{server.url}/ds"
    server.gate.clear()  # the first sync to take the lock stalls on its first file ...
    procs = [subprocess.Popen([sys.executable, str(HELPERS / "sync_json.py"), source, str(cache)], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
    lock = cache / dataset_key(source) / ".lock"
    wait_for(lambda: lock.exists() and lock_waiters(lock) == 3, "three syncs blocked on the dataset lock")
    server.gate.set()  # ... until the other three wait on the lock
    results = []
    for p in procs:
        out, errs = p.communicate(timeout=120)
        assert p.returncode == 0, errs
        results.append(json.loads(out))
    assert len({r["path"] for r in results}) == 1
    assert server.data_bytes() == sum(SMALL_TREE.values())
    assert sorted((r["waited"], r["files_copied"]) for r in results) == [(False, len(SMALL_TREE))] + [(True, 0)] * 3
    assert_complete_and_correct(Path(results[0]["path"]), digests(www / "ds"))


def test_lock_timeout_while_another_process_syncs(tmp_path, http_root):
    www, server = http_root
    write_tree(www / "ds", {"a.bin": 10_000}, seed=9)
    write_manifest(www / "ds")
    cache, source = tmp_path / "cache", f"{server.url}/ds"
    server.gate.clear()
    proc = subprocess.Popen([sys.executable, str(HELPERS / "sync_json.py"), source, str(cache)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: server.gets["/ds/a.bin"] == 1, "the other sync to start copying")
    with pytest.raises(CacheError, match="timed out waiting for another process syncing"):
        sync(source, cache, lock_timeout=0.2)
    server.gate.set()
    assert proc.wait(60) == 0
    assert sync(source, cache, lock_timeout=5).files_copied == 0


# -- eviction ------------------------------------------------------------------------------------------------

def make_datasets(tmp_path: Path, cache: Path, names: str) -> dict[str, str]:
    """One small local dataset per letter, synced in order (so the first is least recently used)."""
    keys = {}
    for i, name in enumerate(names):
        src = tmp_path / f"src-{name}"
        write_tree(src, {"x.bin": 10_000 * (i + 1)}, seed=i)
        keys[name] = sync(str(src), cache).key
    return keys


def start_holder(cache: Path, key: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, str(HELPERS / "hold.py"), str(cache), key], cwd=ROOT,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_eviction_is_lru_and_never_removes_a_held_dataset(tmp_path):
    cache = tmp_path / "cache"
    k = make_datasets(tmp_path, cache, "abc")
    with hold(cache, k["a"]):  # a job used "a" last: "b" is now least recently used
        pass
    assert evict(cache, quota_bytes=10_000 + 30_000) == [k["b"]]
    holder = start_holder(cache, k["a"])
    try:
        shown = {d.key: d for d in list_datasets(cache)}
        assert (shown[k["a"]].held, shown[k["c"]].held) == (True, False)
        assert evict(cache, keys=[k["a"]]) == []
        assert evict(cache, quota_bytes=0) == [k["c"]]
        assert [d.key for d in list_datasets(cache)] == [k["a"]]
        assert cached_path(str(tmp_path / "src-a"), cache) is not None
        proc = cli("cache", "evict", cache, k["a"])
        assert proc.returncode == 1 and "in use" in proc.stderr
    finally:
        holder.kill()  # SIGKILL: the kernel drops the flock with the process
        holder.wait()
    assert evict(cache, keys=[k["a"]]) == [k["a"]]
    assert list_datasets(cache) == [] and not any(cache.iterdir())


def test_sync_quota_evicts_least_recently_used_or_says_how_much_is_needed(tmp_path):
    cache = tmp_path / "cache"
    k = make_datasets(tmp_path, cache, "ab")  # 10 kB and 20 kB
    write_tree(tmp_path / "src-c", {"x.bin": 30_000}, seed=3)
    sync(str(tmp_path / "src-c"), cache, quota_bytes=50_000)
    assert {d.key for d in list_datasets(cache)} == {k["b"], dataset_key(str(tmp_path / "src-c"))}
    write_tree(tmp_path / "src-d", {"x.bin": 40_000}, seed=4)
    holder = start_holder(cache, k["b"])
    try:
        with pytest.raises(CacheError, match=r"needs 39\.1 KiB \(40000 bytes\)"):
            sync(str(tmp_path / "src-d"), cache, quota_bytes=50_000)
    finally:
        holder.kill()
        holder.wait()
    assert k["b"] in {d.key for d in list_datasets(cache)}


def test_ls_shows_held_and_incomplete_datasets(tmp_path):
    cache = tmp_path / "cache"
    k = make_datasets(tmp_path, cache, "a")
    src = tmp_path / "src-bad"
    write_tree(src, {"ok.bin": 100, "zz-bad.bin": 100}, seed=5)
    doc = json.loads(write_manifest(src).read_text())
    doc["files"][1]["sha256"] = "0" * 64
    (src / MANIFEST).write_text(json.dumps(doc))
    with pytest.raises(CacheError, match="zz-bad.bin"):
        sync(str(src), cache, workers=1)
    holder = start_holder(cache, k["a"])
    try:
        proc = cli("cache", "ls", cache)
    finally:
        holder.kill()
        holder.wait()
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line.split() for line in proc.stdout.splitlines()[1:]}
    bad = dataset_key(str(src))
    assert rows[k["a"]][1:2] == [str(tmp_path / "src-a")] and rows[k["a"]][-2:] == ["yes", "yes"]
    assert rows[bad][1] == str(src) and rows[bad][-2:] == ["no", "no"]


# -- the command line ----------------------------------------------------------------------------------------

def test_cli_sync_prints_the_path_and_fails_cleanly_on_bad_input(tmp_path):
    src = tmp_path / "src"
    write_tree(src, {"a.bin": 3000, "b/c.bin": 5}, seed=10)
    cache = tmp_path / "cache"
    proc = cli("cache", "sync", src, cache, "--workers", "2", "--quota", "1Mi")
    assert proc.returncode == 0, proc.stderr
    path = Path(proc.stdout.splitlines()[-1])
    assert path == cache / dataset_key(str(src)) / "data" and digests(path) == digests(src)
    assert f"synced {dataset_key(str(src))}: 2 files copied, 0 skipped" in proc.stderr

    missing = tmp_path / "no-such-dataset"
    bad = cli("cache", "sync", missing, cache)
    assert bad.returncode == 2 and str(missing) in bad.stderr and "Traceback" not in bad.stderr
    assert [d.key for d in list_datasets(cache)] == [dataset_key(str(src))]  # the failure left nothing
    bad = cli("cache", "sync", "ftp+nope://host/x", cache)
    assert bad.returncode == 2 and "ftp+nope://host/x" in bad.stderr and "Traceback" not in bad.stderr
    bad = cli("cache", "sync", src, cache, "--quota", "lots")
    assert bad.returncode == 2 and "--quota" in bad.stderr and "Traceback" not in bad.stderr
    bad = cli("cache", "evict", cache)
    assert bad.returncode == 2 and "--quota" in bad.stderr
    bad = cli("cache", "sync", src, cache, "--key", "../escape")
    assert bad.returncode == 2 and "invalid dataset key" in bad.stderr and not (tmp_path / "escape").exists()

    named = cli("cache", "sync", src, cache, "--key", "mine", "--dataset-version", "v2")
    assert named.returncode == 0 and Path(named.stdout.splitlines()[-1]) == cache / "mine" / "data"
    versioned = cli("cache", "sync", src, cache, "--dataset-version", "v2")
    assert Path(versioned.stdout.splitlines()[-1]) == cache / dataset_key(str(src), "v2") / "data"
    assert cached_path(str(src), cache, version="v2") == cache / dataset_key(str(src), "v2") / "data"


def test_cli_manifest_ls_evict(tmp_path):
    src = tmp_path / "src"
    write_tree(src, {"a.bin": 300, "d/b.bin": 7}, seed=11)
    proc = cli("cache", "manifest", src)
    assert proc.returncode == 0 and Path(proc.stdout.strip()) == src / MANIFEST
    doc = json.loads((src / MANIFEST).read_text())
    assert {f["path"]: f["sha256"] for f in doc["files"]} == digests(src)
    cache = tmp_path / "cache"
    key = sync(str(src), cache).key
    assert key in cli("cache", "ls", cache).stdout
    proc = cli("cache", "evict", cache, "--quota", "0")
    assert proc.returncode == 0 and proc.stdout.strip() == f"evicted {key}"
    assert "no datasets" in cli("cache", "ls", cache).stdout
    bad = cli("cache", "manifest", tmp_path / "nope")
    assert bad.returncode == 2 and "nope" in bad.stderr and "Traceback" not in bad.stderr
