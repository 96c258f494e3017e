"""Loader prefetch: one epoch over a shard dataset on disk with a training step per batch, reading in
the loop (prefetch=0, the baseline) against reading ahead on a background thread (prefetch=2).

Two kinds of step: a small MLP's forward/backward on the CPU, which competes with the reader for the
cores (and the GIL where NumPy holds it), so its gain depends on a core being free; and a step that
waits without using the CPU, as the host does while a GPU computes, which shows the overlap itself.

Run by `hvdk8s bench --only loader`.
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from hvdk8s.data.shards import ShardedDataset, write_shards
from hvdk8s.data.torch import ShardedLoader

from .core import Comparison, Row, interleaved

SHAPE = (3, 32, 32)
BATCH = 128
SAMPLES_PER_SHARD = 512
DEVICE_STEP_S = 0.004  # about what a batch takes to read here, so that overlap could halve the epoch


def _epoch(directory: Path, prefetch: int, step: Callable) -> float:
    """Samples/s of one epoch. A fresh dataset each time, so every shard is read from its file again
    (from the page cache after the first epoch: this measures decoding and gathering, not the disk)."""
    loader = ShardedLoader(ShardedDataset(directory), BATCH, rank=0, size=1, seed=0, prefetch=prefetch)
    loader.set_epoch(1)
    start, samples = time.perf_counter(), 0
    for batch in loader:
        step(batch)
        samples += len(batch.x)
    return samples / (time.perf_counter() - start)


def run(quick: bool) -> Comparison:
    n, repeats = (2048, 3) if quick else (16384, 5)
    threads = torch.get_num_threads()
    # One intra-op thread: the step leaves the other core (these machines have two) to the reader.
    torch.set_num_threads(1)
    try:
        with tempfile.TemporaryDirectory(prefix="hvdk8s-bench-loader-") as tmp:
            x = np.random.default_rng(0).standard_normal((n, *SHAPE), dtype=np.float32)
            write_shards(tmp, {"x": x, "y": np.arange(n) % 10}, samples_per_shard=SAMPLES_PER_SHARD,
                         info={"input_shape": list(SHAPE), "num_classes": 10})
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(int(np.prod(SHAPE)), 256),
                                        torch.nn.ReLU(), torch.nn.Linear(256, 10))

            def cpu_step(batch) -> None:
                torch.nn.functional.cross_entropy(model(batch.x), batch.y).backward()
                with torch.no_grad():  # plain SGD by hand: torch.optim's first import takes seconds
                    for param in model.parameters():
                        param -= 0.01 * param.grad
                        param.grad = None

            steps = {"CPU step (MLP)": cpu_step, "device step (host waits)": lambda _: time.sleep(DEVICE_STEP_S)}
            configs = {(group, p): (lambda p=p, step=step: _epoch(Path(tmp), p, step))
                       for group, step in steps.items() for p in (0, 2)}
            _epoch(Path(tmp), 0, cpu_step)  # warm-up: page cache, allocator
            samples = interleaved(configs, repeats)
    finally:
        torch.set_num_threads(threads)
    return Comparison(
        "loader", f"ShardedLoader: one epoch of {n} samples from {n // SAMPLES_PER_SHARD} shards on disk, "
        f"batch {BATCH}, a training step per batch", "samples/s", True, "prefetch=0",
        [Row(f"prefetch={p}", values, group=group) for (group, p), values in samples.items()], target="> 1x",
        notes=f"The device step is a {DEVICE_STEP_S * 1e3:.0f} ms wait. The CPU step's ratio needs a free core: "
              "on a loaded machine reading and stepping take turns on one core, and the two threads hand the GIL "
              "back and forth (NumPy's gathers hold it), so prefetch loses there.")
