"""Rank-sharded `tf.data` pipelines over hvdk8s datasets (the same plans as the PyTorch loaders)."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from .sharding import plan_epoch, step_counts


def sharded_dataset(dataset, batch_size: int, *, rank: int, size: int, seed: int = 0, shuffle: bool = True,
                    first_epoch: int = 1, weights: bool = False, weight_scale: float = 1.0) -> tf.data.Dataset:
    """This rank's part of `dataset`, batched and prefetched.

    Each new iteration over the returned dataset is the next epoch (first_epoch, first_epoch + 1, ...),
    which is what `model.fit(epochs=N)` does, so the order changes every epoch and repeats for a seed.

    weights=True adds a per-sample weight `weight_scale * size / global_count` for a loss with
    reduction="sum": Horovod's average over ranks is then the mean over the samples all ranks read at
    that step. A rank whose part has run out gets one sample with weight 0 (an empty batch would break
    BatchNorm), so every rank runs the same number of steps.
    """
    epoch = {"next": first_epoch}
    x0, y0 = dataset.take(np.arange(1))

    def generate():
        e = epoch["next"]
        epoch["next"] += 1
        order = dataset.epoch_order(seed, e) if shuffle else np.arange(len(dataset))
        plan = plan_epoch(order, rank, size, batch_size)
        for indices, global_count in zip(plan.batches(), plan.global_counts):
            scale = weight_scale * size / float(global_count)
            if len(indices) == 0:
                indices, scale = plan.indices[:1] if len(plan.indices) else np.zeros(1, np.int64), 0.0
            x, y = dataset.take(indices)
            if weights:
                yield x, y, np.full(len(x), scale, np.float32)
            else:
                yield x, y

    signature = [tf.TensorSpec((None, *x0.shape[1:]), tf.as_dtype(x0.dtype)),
                 tf.TensorSpec((None, *y0.shape[1:]), tf.as_dtype(y0.dtype))]
    if weights:
        signature.append(tf.TensorSpec((None,), tf.float32))
    steps = len(step_counts(len(dataset), size, batch_size))
    data = tf.data.Dataset.from_generator(generate, output_signature=tuple(signature))
    return data.apply(tf.data.experimental.assert_cardinality(steps)).prefetch(tf.data.AUTOTUNE)
