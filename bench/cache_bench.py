"""Node-local dataset cache benchmarks, as ratios within one run (these machines are shared and noisy):

1. cold sync of a tree from a local directory, against `cp -r` of the same tree (and `cp -r` + `sync`,
   since the cache hashes and fsyncs every file);
2. warm re-sync of 10,000 small files (seconds), against a bare stat walk of source and cache;
3. one epoch through the loader from a slowed-down HTTP source, against the same epoch from the cache.

Usage: .venv/bin/python bench/cache_bench.py [--repeats 3] [--mbps 50] [--latency-ms 10]
"""
from __future__ import annotations

import argparse
import functools
import http.server
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from hvdk8s.data import cache
from hvdk8s.data.shards import ShardedDataset, write_shards
from hvdk8s.data.torch import ShardedLoader


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def make_tree(root: Path, big: int, big_size: int, small: int, small_size: int) -> int:
    rng = np.random.default_rng(0)
    total = 0
    for i in range(big):
        (root / "big").mkdir(parents=True, exist_ok=True)
        (root / "big" / f"f{i:04d}.bin").write_bytes(rng.bytes(big_size))
        total += big_size
    for i in range(small):
        d = root / "small" / f"d{i // 1000:02d}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i:05d}.bin").write_bytes(rng.bytes(small_size))
        total += small_size
    return total


def drop(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def cold_sync_vs_cp(work: Path, repeats: int) -> dict:
    src = work / "cold-src"
    total = make_tree(src, big=48, big_size=4 << 20, small=512, small_size=64 << 10)
    sync_times, cp_times, durable_times = [], [], []
    for r in range(repeats):  # interleaved, so all see the same machine
        dst = work / f"cp-{r}"
        cp_times.append(timed(lambda: subprocess.run(["cp", "-r", str(src), str(dst)], check=True)))
        drop(dst)
        # cp leaves the data in the page cache; hvdk8s fsyncs each file before it counts as cached
        durable_times.append(timed(lambda: subprocess.run(f"cp -r '{src}' '{dst}' && sync -f '{work}'",
                                                          shell=True, check=True)))
        drop(dst)
        root = work / f"cache-{r}"
        sync_times.append(timed(lambda: cache.sync(str(src), root)))
        drop(root)
    s, c, d = statistics.median(sync_times), statistics.median(cp_times), statistics.median(durable_times)
    return {"bytes": total, "files": 48 + 512, "sync_s": s, "cp_s": c, "cp_sync_s": d, "sync_MBps": total / s / 1e6,
            "cp_MBps": total / c / 1e6, "sync_over_cp": s / c, "sync_over_cp_sync": s / d}


def warm_resync(work: Path, repeats: int) -> dict:
    src = work / "warm-src"
    make_tree(src, big=0, big_size=0, small=10_000, small_size=1024)
    root = work / "warm-cache"
    cache.sync(str(src), root)
    warm = [timed(lambda: cache.sync(str(src), root)) for _ in range(repeats)]

    def stat_walk():
        for base in (src, root):
            for dirpath, _, files in os.walk(base):
                for f in files:
                    os.stat(os.path.join(dirpath, f))

    walk = [timed(stat_walk) for _ in range(repeats)]
    w, s = statistics.median(warm), statistics.median(walk)
    return {"files": 10_000, "warm_sync_s": w, "stat_walk_s": s, "warm_over_stat_walk": w / s}


class SlowHandler(http.server.SimpleHTTPRequestHandler):
    """Serves files with a per-request latency and a bandwidth cap, like a remote store over a WAN."""

    latency = 0.01
    bytes_per_s = 50e6

    def log_message(self, *args):  # quiet
        pass

    def copyfile(self, source, outputfile):
        time.sleep(self.latency)
        chunk = 256 << 10
        while block := source.read(chunk):
            outputfile.write(block)
            time.sleep(len(block) / self.bytes_per_s)


def epoch_remote_vs_cache(work: Path, repeats: int, mbps: float, latency_ms: float) -> dict:
    served = work / "served"
    n, shape = 20 * 256, (3, 32, 32)
    x = np.random.default_rng(1).standard_normal((n, *shape), dtype=np.float32)
    write_shards(served / "train", {"x": x, "y": np.arange(n) % 10}, samples_per_shard=256,
                 info={"input_shape": list(shape), "num_classes": 10})
    cache.write_manifest(served)
    handler = functools.partial(type("H", (SlowHandler,), {"latency": latency_ms / 1e3, "bytes_per_s": mbps * 1e6}),
                                directory=str(served))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        def epoch(dataset) -> None:
            loader = ShardedLoader(dataset, 256, rank=0, size=1, seed=0)
            loader.set_epoch(1)
            for _ in loader:
                pass

        root = work / "epoch-cache"
        sync_s = timed(lambda: cache.sync(f"{url}/hvdk8s-manifest.json", root))
        local = cache.cached_path(f"{url}/hvdk8s-manifest.json", root)
        remote_t, cached_t = [], []
        for _ in range(repeats):
            remote_t.append(timed(lambda: epoch(ShardedDataset(f"{url}/train"))))
            cached_t.append(timed(lambda: epoch(ShardedDataset(local / "train"))))
    finally:
        server.shutdown()
    r, c = statistics.median(remote_t), statistics.median(cached_t)
    return {"samples": n, "bytes": int(x.nbytes), "link_MBps": mbps, "latency_ms": latency_ms,
            "remote_epoch_s": r, "cached_epoch_s": c, "remote_over_cached": r / c, "one_time_sync_s": sync_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--mbps", type=float, default=50.0, help="bandwidth cap of the slowed source, MB/s")
    ap.add_argument("--latency-ms", type=float, default=10.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="hvdk8s-bench-") as tmp:
        work = Path(tmp)
        results = {"cold": cold_sync_vs_cp(work, args.repeats), "warm": warm_resync(work, args.repeats),
                   "epoch": epoch_remote_vs_cache(work, args.repeats, args.mbps, args.latency_ms)}
    c, w, e = results["cold"], results["warm"], results["epoch"]
    print(f"cold sync  {c['files']} files, {c['bytes'] / 1e6:.0f} MB: hvdk8s {c['sync_s']:.2f}s "
          f"({c['sync_MBps']:.0f} MB/s, hashed and fsynced), cp -r {c['cp_s']:.2f}s ({c['cp_MBps']:.0f} MB/s): "
          f"{c['sync_over_cp']:.2f}x cp; cp -r + sync {c['cp_sync_s']:.2f}s: {c['sync_over_cp_sync']:.2f}x")
    print(f"warm sync  {w['files']} small files: {w['warm_sync_s']:.2f}s; a bare stat walk of both trees "
          f"{w['stat_walk_s']:.2f}s: {w['warm_over_stat_walk']:.2f}x")
    print(f"epoch      {e['samples']} samples, {e['bytes'] / 1e6:.0f} MB over a {e['link_MBps']:.0f} MB/s, "
          f"{e['latency_ms']:.0f} ms link: remote {e['remote_epoch_s']:.2f}s, cached {e['cached_epoch_s']:.2f}s: "
          f"{e['remote_over_cached']:.1f}x faster from the cache (one-time sync {e['one_time_sync_s']:.2f}s with 8 "
          "parallel streams; the cap is per connection)")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
