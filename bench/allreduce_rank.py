"""One rank of the allreduce benchmark: Horovod allreduce of float32 tensors from 1 KB up, sent as
float32 and fp16-compressed. Rank 0 writes {"sizes": [...], "fp32": [s...], "fp16": [s...]}: the median
seconds per allreduce at each size.

    python -m hvdk8s.bench.allreduce_rank '{"max_bytes": N, "out": PATH}'
"""
from __future__ import annotations

import json
import statistics
import sys
import time

import horovod.torch as hvd
import torch

import hvdk8s.torch as ht

BUDGET_BYTES = 1 << 30  # per size and compression: enough repeats for a stable median, bounded time


def sizes(max_bytes: int) -> list[int]:
    out, n = [], 1024
    while n <= max_bytes:
        out.append(n)
        n *= 4
    return out


def seconds_per_allreduce(tensor: torch.Tensor, compression, repeats: int, name: str) -> float:
    times = []
    for i in range(repeats + 2):
        hvd.allreduce(torch.zeros(1), name="bench.barrier")
        start = time.perf_counter()
        hvd.allreduce(tensor, compression=compression, name=name)
        if tensor.is_cuda:
            torch.cuda.synchronize(tensor.device)
        times.append(time.perf_counter() - start)
    return statistics.median(times[2:])  # the first two allocate buffers and fill the response cache


def sweep(max_bytes: int) -> dict:
    """{"sizes", "ranks", "fp32", "fp16"}: median seconds per allreduce at each size (after ht.init())."""
    result = {"sizes": sizes(max_bytes), "ranks": hvd.size(), "fp32": [], "fp16": []}
    for size in result["sizes"]:
        tensor = torch.rand(size // 4, device=ht.device())
        repeats = max(3, min(50, BUDGET_BYTES // size // 8))
        for label, comp in (("fp32", hvd.Compression.none), ("fp16", hvd.Compression.fp16)):
            result[label].append(seconds_per_allreduce(tensor, comp, repeats, f"bench.{label}.{size}"))
    return result


def main(config: dict) -> None:
    ht.init()
    result = sweep(config["max_bytes"])
    if hvd.rank() == 0:
        with open(config["out"], "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    from hvdk8s.core.exiting import exit_at_once

    main(json.loads(sys.argv[1]))
    exit_at_once(0)  # as hvdk8s's own ranks end: after the exit handlers, no teardown (~0.8 CPU-s)
