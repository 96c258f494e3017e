"""TensorFlow input path: samples/s of one epoch of the digits dataset (batch 32, one rank) read through
`hvdk8s.data.tensorflow.sharded_dataset`, against the PyTorch `ShardedLoader` over the same data and plan.
Only reading is timed (no model): what the input pipeline itself can deliver. The PyTorch loader is
plain NumPy indexing, so it is the ceiling here; the figure that matters is the pipeline's own rate
against what `model.fit` consumes (before the vectorised pipeline: 22-33k samples/s on this machine)."""
from __future__ import annotations

import time

from .core import Comparison, Row, interleaved

BATCH = 32


def _samples_per_second(batches, epochs: int) -> float:
    """Samples/s over `epochs` passes of `batches()` (each call starts the next epoch)."""
    start, samples = time.perf_counter(), 0
    for _ in range(epochs):
        for batch in batches():
            samples += len(batch[1])
    return samples / (time.perf_counter() - start)


def run(quick: bool) -> Comparison:
    # Imported here, so that importing this module stays cheap.
    from hvdk8s.data.datasets import digits
    from hvdk8s.data.tensorflow import sharded_dataset
    from hvdk8s.data.torch import ShardedLoader

    ds = digits()
    tf_data = sharded_dataset(ds, BATCH, rank=0, size=1, seed=0)  # each pass is the next epoch
    loader = ShardedLoader(ds, BATCH, rank=0, size=1, seed=0)
    epoch = {"torch": 0}

    def torch_epoch():
        epoch["torch"] += 1
        loader.set_epoch(epoch["torch"])
        return loader

    epochs, repeats = (1, 3) if quick else (5, 7)
    configs = {"torch ShardedLoader": lambda: _samples_per_second(torch_epoch, epochs),
               "tf.data sharded_dataset": lambda: _samples_per_second(lambda: tf_data, epochs)}
    for measure in configs.values():  # warm-up: tf.data traces its functions on the first pass
        measure()
    rows = [Row(config=name, samples=s) for name, s in interleaved(configs, repeats).items()]
    return Comparison("tf_input", f"Input pipeline: digits ({len(ds)} samples), batch {BATCH}, one rank",
                      "samples/s", higher_is_better=True, baseline="torch ShardedLoader", rows=rows,
                      notes="one epoch read through each loader, no model step; tf.data pays TensorFlow's own "
                            "per-batch iteration cost in Python, which model.fit mostly avoids")
