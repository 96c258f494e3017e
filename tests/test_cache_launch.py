"""The cache before launch: `hvdk8s launch --local` syncs a remote dataset into the node-local cache
before starting the ranks, which train from it; the next launch reuses it without fetching again."""
import contextlib
import functools
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
import time

import pytest
import yaml

from conftest import DIGITS_JOB, ROOT, cli, events_of
from hvdk8s.data import cache
from hvdk8s.data.datasets import digits, train_test_split
from hvdk8s.data.shards import write_shards
from test_cache import HELPERS

pytestmark = pytest.mark.ranks


class CountingHandler(http.server.SimpleHTTPRequestHandler):
    served: dict = {}

    def log_message(self, *args):
        pass

    def copyfile(self, source, outputfile):
        data = source.read()
        outputfile.write(data)
        self.served[self.path] = self.served.get(self.path, 0) + len(data)


@contextlib.contextmanager
def serving_digits(root):
    """The digits dataset in the shard format with its hvdk8s-manifest.json, written to `root` and served
    over HTTP on 127.0.0.1: yields the port and the bytes served per path."""
    train, test = train_test_split(digits(), 0.2)
    for split, ds in (("train", train), ("test", test)):
        write_shards(root / split, {"x": ds.x, "y": ds.y}, samples_per_shard=100, info=ds.info)  # many small shards mix well
    cache.write_manifest(root)
    handler_cls = type("Handler", (CountingHandler,), {"served": {}})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler_cls, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1], handler_cls.served
    finally:
        server.shutdown()


@pytest.fixture
def digits_over_http(tmp_path):
    with serving_digits(tmp_path / "served") as (port, served):
        yield f"http://127.0.0.1:{port}/hvdk8s-manifest.json", served


def test_launch_syncs_then_trains_from_the_cache_and_reuses_it(digits_over_http, tmp_path):
    url, served = digits_over_http
    data = yaml.safe_load(DIGITS_JOB.read_text())
    data["dataset"] = {"path": url, "version": "v1"}
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(data))
    env = {"HVDK8S_CACHE_DIR": str(tmp_path / "cache")}

    first = cli("launch", "--local", "-np", "2", "--log-format", "json", job, env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    assert re.search(r"synced \S+: \d+ files copied", first.stderr), first.stderr
    [done] = events_of(first.stdout, "done")
    assert done["test_accuracy"] >= 0.95, first.stdout
    local = cache.cached_path(url, tmp_path / "cache", "v1")
    assert (local / "train" / "index.json").is_file()
    data_bytes = sum(v for k, v in served.items() if not k.endswith("manifest.json"))
    assert data_bytes == sum(p.stat().st_size for p in local.rglob("*") if p.is_file())

    served_before = dict(served)
    second = cli("launch", "--local", "-np", "2", job, env=env)
    assert second.returncode == 0, second.stdout + second.stderr
    assert re.search(r"synced \S+: 0 files copied", second.stderr), second.stderr
    fetched_again = {k: v - served_before.get(k, 0) for k, v in served.items()
                     if not k.endswith("manifest.json") and v != served_before.get(k, 0)}
    assert fetched_again == {}, "the second launch fetched data again"


def test_training_an_unsynced_dataset_says_how_to_sync(tmp_path):
    data = yaml.safe_load(DIGITS_JOB.read_text())
    data["dataset"] = {"path": "https://127.0.0.1:9/nowhere/hvdk8s-manifest.json"}
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(data))
    proc = cli("train", job, env={"HVDK8S_CACHE_DIR": str(tmp_path / "empty")}, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "is not in the node-local cache" in proc.stderr and "hvdk8s cache sync" in proc.stderr


def test_eviction_between_the_launch_sync_and_the_ranks_never_removes_the_dataset(tmp_path):
    """`cache evict --quota 0` (another job's quota on the node) runs again and again from the moment the
    launch's sync completes until the launch ends: the launcher holds the dataset from its sync on. The
    ranks run a script (no framework to import) that waits a second before taking its own hold.

    The launcher's hold ends with its process, which the kernel lets go of a moment before `poll()` can
    see the exit; so an eviction counts against the hold only if it came before the launcher had passed
    on both ranks' reads (until then it was alive, holding the dataset)."""
    src = tmp_path / "data"
    src.mkdir()
    (src / "a.bin").write_bytes(b"a" * 5000)
    shutil.copy(HELPERS / "rank_reads_cache.py", tmp_path / "reads.py")
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"name": "cache-hold", "framework": "pytorch",
                                   "entrypoint": {"script": "reads.py"}, "dataset": {"path": str(src), "cache": True},
                                   "training": {"epochs": 1, "batch_size": 8, "learning_rate": 0.1}}))
    root = tmp_path / "cache"
    key = cache.dataset_key(str(src))
    manifest = root / key / "manifest.json"
    launch = subprocess.Popen([sys.executable, "-m", "hvdk8s", "launch", "--local", "-np", "2", str(job)], cwd=ROOT,
                              env={**os.environ, "HVDK8S_CACHE_DIR": str(root)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(launch.stdout), daemon=True)
    reader.start()
    deadline = time.monotonic() + 300  # a watchdog, not a bound
    while not manifest.exists():
        assert launch.poll() is None and time.monotonic() < deadline, "the launch ended before its sync completed"
        time.sleep(0.005)
    early, late, tries = [], [], 0
    while launch.poll() is None:
        reads_seen = sum("read 5000 bytes" in line for line in list(lines))
        (late if reads_seen == 2 else early).extend(cache.evict(root, quota_bytes=0))
        tries += 1
        time.sleep(0.02)
    reader.join(timeout=30)
    out = "".join(lines)
    assert launch.returncode == 0 and early == [], out
    assert tries > 10 and out.count("read 5000 bytes") == 2, out
    assert late + cache.evict(root, quota_bytes=0) == [key]  # released with the launcher
