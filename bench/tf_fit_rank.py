"""One rank of the TensorFlow benchmark: Keras `model.fit` on this rank's part of synthetic images,
plain ("keras": no Horovod at all) or through hvdk8s.tensorflow ("hvdk8s"). Rank 0 writes the global
training samples/s: the median over epochs after the first (TensorFlow's epochs on
this machine swing by up to 1.5x within one process), and each of those epochs' rates.

    python -m hvdk8s.bench.tf_fit_rank '{"mode": "keras" | "hvdk8s", "samples": N, "epochs": N, "out": PATH}'
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from hvdk8s.models import build  # noqa: E402


class EpochTimer(keras.callbacks.Callback):
    """Each epoch's wall seconds."""

    def __init__(self):
        super().__init__()
        self.seconds: list[float] = []

    def on_epoch_begin(self, epoch, logs=None):
        self.began = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.seconds.append(time.perf_counter() - self.began)


def main(config: dict) -> None:
    rank, size, callbacks = 0, 1, []
    if config["mode"] == "hvdk8s":
        import hvdk8s.tensorflow as htf
        htf.init()
        rank, size, callbacks = htf.rank(), htf.size(), htf.callbacks()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((config["samples"], 3, 32, 32), dtype=np.float32)
    y = rng.integers(0, 10, config["samples"])
    x, y = x[rank::size], y[rank::size]
    keras.utils.set_random_seed(0)
    model = build("mlp", "tensorflow", {"hidden": [512, 512]}, input_shape=[3, 32, 32], num_classes=10)
    optimizer = keras.optimizers.SGD(0.01 * size, momentum=0.9)
    if config["mode"] == "hvdk8s":
        optimizer = htf.distribute(model, optimizer)
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    timer = EpochTimer()
    model.fit(x, y, batch_size=32, epochs=config["epochs"], verbose=0, callbacks=[*callbacks, timer], shuffle=True)
    if rank == 0:
        with open(config["out"], "w") as f:
            counted = timer.seconds[1:] or timer.seconds  # the first epoch traces and warms up
            rates = [len(x) * size / s for s in counted]
            json.dump({"samples_per_s": statistics.median(rates), "epochs": rates}, f)


if __name__ == "__main__":
    from hvdk8s.core.exiting import exit_at_once

    main(json.loads(sys.argv[1]))
    exit_at_once(0)  # as hvdk8s's own ranks end: after the exit handlers, no teardown (~0.8 CPU-s)
