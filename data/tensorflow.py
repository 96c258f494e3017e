"""Rank-sharded `tf.data` pipelines over hvdk8s datasets (the same plans as the PyTorch loaders)."""
from __future__ import annotations

from typing import Optional

import numpy as np
import tensorflow as tf

from .datasets import ArrayDataset, IndexSubset
from .rankplans import plan_epoch, step_counts

# In-memory arrays up to this size are copied into the pipeline and gathered from by TensorFlow; larger
# ones are read through `dataset.take` instead, so the copy never doubles a big dataset's memory.
_IN_PIPELINE_BYTES = 1 << 30


def _in_memory(dataset) -> Optional[tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]]:
    """(x, y, m) when `dataset.take(i)` is `(x[m[i]], y[m[i]])` (m None: the identity), else None.
    Exact classes only: a subclass may override `take` (to augment, say)."""
    if type(dataset) is ArrayDataset:
        return dataset.x, dataset.y, None
    if type(dataset) is IndexSubset and (inner := _in_memory(dataset.base)) is not None:
        x, y, m = inner
        subset = np.asarray(dataset.indices, np.int64)
        return x, y, subset if m is None else m[subset]
    return None


def sharded_dataset(dataset, batch_size: int, *, rank: int, size: int, seed: int = 0, shuffle: bool = True,
                    first_epoch: int = 1, weights: bool = False, weight_scale: float = 1.0,
                    order: Optional[np.ndarray] = None) -> tf.data.Dataset:
    """This rank's part of `dataset`, batched and prefetched: the batches of `plan_epoch`, in its order.

    Each new iteration over the returned dataset is the next epoch (first_epoch, first_epoch + 1, ...),
    which is what `model.fit(epochs=N)` does, so the order changes every epoch and repeats for a seed.
    Every epoch has `len(step_counts(len(dataset), size, batch_size))` batches (asserted as the
    cardinality), on every rank.

    weights=True adds a per-sample weight `weight_scale * size / global_count` for a loss with
    reduction="sum": Horovod's average over ranks is then the mean over the samples all ranks read at
    that step. A rank whose part has run out gets one sample (the first of its part, or sample 0 if its
    part is empty) with weight 0 (an empty batch would break BatchNorm), so every rank runs the same
    number of steps.

    The epoch's plan is made in numpy in one Python call, as one element (indices padded to
    [steps, batch_size], batch lengths, weight scales) that is then cut into steps. Batches of data held
    in memory (ArrayDataset, or an IndexSubset of one) are gathered by TensorFlow in parallel; any other
    dataset's are read by `dataset.take`, one batch at a time (a dataset need not be thread-safe: the
    shard cache of one on disk is not), ahead of the training step.

    `order` fixes the global order of every pass (elastic training gives what is left of an epoch after
    the ranks changed, `hvdk8s.data.rankplans.unread_after`, and iterates once).
    """
    arrays = _in_memory(dataset)
    if arrays is not None and arrays[0].nbytes + arrays[1].nbytes > _IN_PIPELINE_BYTES:
        arrays = None
    epoch = {"next": first_epoch}

    def plan():
        e = epoch["next"]
        epoch["next"] += 1
        this = order if order is not None else dataset.epoch_order(seed, e) if shuffle else np.arange(len(dataset))
        p = plan_epoch(this, rank, size, batch_size)
        n = len(p.indices)
        index = np.zeros(p.steps * batch_size, np.int64)
        index[:n] = p.indices
        index = index.reshape(p.steps, batch_size)
        lengths = np.clip(n - np.arange(p.steps) * batch_size, 0, batch_size).astype(np.int32)
        scales = (weight_scale * size / p.global_counts.astype(np.float64)).astype(np.float32)
        spent = lengths == 0  # this rank's part has run out: one sample at weight 0
        index[spent, 0] = p.indices[0] if n else 0
        lengths[spent], scales[spent] = 1, 0.0
        if arrays is not None and arrays[2] is not None:
            index = arrays[2][index]
        return index, lengths, scales

    def planned(_):
        index, lengths, scales = tf.numpy_function(plan, [], [tf.int64, tf.int32, tf.float32])
        index.set_shape((None, batch_size))
        lengths.set_shape((None,))
        scales.set_shape((None,))
        return index, lengths, scales

    def batch(x, y, length, scale):
        return (x, y, tf.fill([length], scale)) if weights else (x, y)

    if arrays is not None:
        x_all, y_all = tf.constant(arrays[0]), tf.constant(arrays[1])

        def read(index, length, scale):
            return batch(tf.gather(x_all, index[:length]), tf.gather(y_all, index[:length]), length, scale)
        parallel = {"num_parallel_calls": tf.data.AUTOTUNE, "deterministic": True}  # the plan's order
    else:
        x0, y0 = dataset.take(np.arange(1))

        def read(index, length, scale):
            x, y = tf.numpy_function(dataset.take, [index[:length]],
                                     [tf.as_dtype(x0.dtype), tf.as_dtype(y0.dtype)])
            x.set_shape((None, *x0.shape[1:]))
            y.set_shape((None, *y0.shape[1:]))
            return batch(x, y, length, scale)
        parallel = {}  # one take at a time, as before: a dataset need not be thread-safe

    # One element, mapped anew on every iteration (the numpy_function is stateful), cut into steps.
    # (Dataset.from_generator would do, but takes tens of milliseconds to start each epoch.)
    steps = len(step_counts(len(dataset) if order is None else len(order), size, batch_size))
    data = tf.data.Dataset.range(1).map(planned).unbatch().map(read, **parallel)
    return data.apply(tf.data.experimental.assert_cardinality(steps)).prefetch(tf.data.AUTOTUNE)
