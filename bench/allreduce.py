"""4. fp16 compression: allreduce of 1 KB to 256 MB on 2 ranks, float32 against fp16-compressed.

Bandwidths as nccl-tests define them (performance.md there): algorithm bandwidth = bytes / time, and
bus bandwidth = algbw * 2(n-1)/n for allreduce, which compares with the hardware's link speed. Here
the ranks share one machine's memory, so this machine's memcpy bandwidth is the physical limit."""
from __future__ import annotations

import time

import numpy as np

from hvdk8s.bench.core import Comparison, Row
from hvdk8s.bench.ranks import run_json

RANK_MODULE = "hvdk8s.bench.allreduce_rank"


def memcpy_gbps(nbytes: int = 256 << 20, repeats: int = 5) -> float:
    src, dst = np.ones(nbytes, np.uint8), np.empty(nbytes, np.uint8)
    best = min(_timed(lambda: np.copyto(dst, src)) for _ in range(repeats))
    return nbytes / best / 1e9


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def size_label(nbytes: int) -> str:
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def run(quick: bool) -> Comparison:
    np_ranks = 2
    repeats = 1 if quick else 2
    runs = [run_json(RANK_MODULE, {"max_bytes": (1 << 20) if quick else (256 << 20)}, "hvdk8s", np_ranks)
            for _ in range(repeats)]
    factor = 2 * (np_ranks - 1) / np_ranks
    rows = []
    for i, size in enumerate(runs[0]["sizes"]):
        for label in ("fp32", "fp16"):
            seconds = [r[label][i] for r in runs]
            rows.append(Row(config=label, group=size_label(size), x=float(size),
                            samples=[size / s / 1e9 * factor for s in seconds],
                            extra={"ms": [1000 * s for s in seconds], "algbw_gbps": [size / s / 1e9 for s in seconds]}))
    return Comparison("allreduce", "Allreduce bus bandwidth on 2 ranks: float32 vs fp16 compression", "GB/s",
                      higher_is_better=True, baseline="fp32", rows=rows, plot="line", x_label="tensor size (bytes)",
                      references={"memcpy (1 thread)": memcpy_gbps()},
                      notes="busbw = size/time x 2(n-1)/n (nccl-tests). fp16 halves the bytes on the wire but adds "
                            "two casts per element; within one machine memory bandwidth bounds both.")
