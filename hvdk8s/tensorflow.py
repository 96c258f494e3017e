"""Horovod for TensorFlow 2 with Keras 3: the same verbs as `hvdk8s.torch`.

Horovod 0.28.1's own Keras layer (`horovod.tensorflow.keras`, `DistributedGradientTape`) calls
`Variable.ref()`, which Keras 3 variables lack. This module builds on Horovod's core TensorFlow ops
only (grouped_allreduce, broadcast, fp16 compression), which work with TF 2.16+ and Keras 3:

    import keras, hvdk8s.tensorflow as htf
    htf.init()
    model = ...
    optimizer = htf.distribute(keras.optimizers.SGD(0.05 * htf.size()), compression="auto")
    model.compile(optimizer=optimizer, loss=..., jit_compile=False)   # Horovod ops do not run under XLA
    model.fit(data, callbacks=htf.callbacks(), verbose=htf.verbose())

The distributed optimizer averages gradients inside `optimizer.apply`, which both `model.fit` and a
custom `GradientTape` loop (`optimizer.apply(grads, model.trainable_variables)`) go through.
"""
from __future__ import annotations

import os
from typing import Any, Optional, Sequence

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

from hvdk8s import compression as _compression

rank, size, local_rank, local_size, cross_size = hvd.rank, hvd.size, hvd.local_rank, hvd.local_size, hvd.cross_size
Average, Sum = hvd.Average, hvd.Sum

_COMPRESSORS = {"fp16": hvd.Compression.fp16, "none": hvd.Compression.none}


def init(threads_per_rank: Optional[int] = None) -> None:
    """Start Horovod and give this rank its share of the machine: on GPU the device of the local rank
    (with memory growth), on CPU `threads_per_rank` intra-op threads (default: cores / local ranks)."""
    hvd.init()
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        gpu = gpus[hvd.local_rank() % len(gpus)]
        tf.config.experimental.set_memory_growth(gpu, True)
        tf.config.set_visible_devices(gpu, "GPU")
        return
    threads = threads_per_rank or max(1, (os.cpu_count() or 1) // hvd.local_size())
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)


def is_rank0() -> bool:
    return hvd.rank() == 0


def log(*args: Any, **kwargs: Any) -> None:
    """print() on rank 0 only."""
    if hvd.rank() == 0:
        print(*args, **kwargs, flush=True)


def verbose() -> int:
    """Keras `verbose` for fit/evaluate: progress from rank 0 only."""
    return 1 if hvd.rank() == 0 else 0


def resolve_compression(choice: str = "auto") -> str:
    """'fp16' or 'none': `auto` is fp16 only for GPU jobs that span more than one node."""
    return _compression.resolve(choice, on_gpu=bool(tf.config.list_logical_devices("GPU")),
                                nodes=hvd.cross_size())


def allreduce_gradients(grads: Sequence[Optional[tf.Tensor]], compression: str = "auto", op=None):
    """Average gradients over all ranks in one grouped allreduce (None entries pass through)."""
    if hvd.size() == 1:
        return list(grads)
    present = [i for i, g in enumerate(grads) if g is not None]
    if not present:
        return list(grads)
    dense = [tf.convert_to_tensor(grads[i]) for i in present]  # IndexedSlices (embeddings) -> dense
    reduced = hvd.grouped_allreduce(dense, op=hvd.Average if op is None else op,
                                    compression=_COMPRESSORS[resolve_compression(compression)])
    out = list(grads)
    for i, g in zip(present, reduced):
        out[i] = g
    return out


class _Distributed:
    """Mixed into a Keras optimizer class: average gradients across ranks before applying them."""

    _hvdk8s_compression = "auto"
    _hvdk8s_op = None

    def apply(self, grads, trainable_variables=None):
        return super().apply(allreduce_gradients(list(grads), self._hvdk8s_compression, self._hvdk8s_op),
                             trainable_variables)


def distribute(optimizer: keras.optimizers.Optimizer, *, compression: str = "auto", op=None,
               backward_passes_per_step: int = 1) -> keras.optimizers.Optimizer:
    """A copy of `optimizer` (same class and settings) whose updates use gradients averaged over all
    ranks. backward_passes_per_step > 1 accumulates that many batches per update (Keras 3's
    gradient_accumulation_steps)."""
    cls = type(optimizer)
    dist_cls = type(cls.__name__, (_Distributed, cls), {"_hvdk8s_compression": compression, "_hvdk8s_op": op})
    config = optimizer.get_config()
    if backward_passes_per_step > 1:
        config["gradient_accumulation_steps"] = backward_passes_per_step
    return dist_cls.from_config(config)


def broadcast_variables(variables: Sequence, root_rank: int = 0, prefix: str = "hvdk8s.bcast") -> None:
    """Assign root_rank's values to `variables` (Keras 3 or tf.Variables) on every rank."""
    for i, v in enumerate(variables):
        value = v.value if hasattr(v, "value") else v
        v.assign(hvd.broadcast(tf.convert_to_tensor(value), root_rank, name=f"{prefix}.{i}"))


def broadcast_state(model: keras.Model, optimizer: Optional[keras.optimizers.Optimizer] = None,
                    root_rank: int = 0) -> None:
    """Make every rank hold root_rank's model variables and optimizer state (building the optimizer's
    slots first if it has none yet, so they exist everywhere)."""
    broadcast_variables(model.variables, root_rank, "hvdk8s.model")
    if optimizer is not None:
        if not optimizer.built:
            optimizer.build(model.trainable_variables)
        broadcast_variables(optimizer.variables, root_rank, "hvdk8s.optimizer")


def allreduce(value, op=None, name: Optional[str] = None) -> np.ndarray:
    """Allreduce a number or array in float64 (so sums of counts stay exact)."""
    t = tf.convert_to_tensor(np.asarray(value, dtype=np.float64))
    return hvd.allreduce(t, op=hvd.Average if op is None else op, name=name).numpy()


def metric_average(value, name: Optional[str] = None) -> float:
    return float(allreduce(value, hvd.Average, name))


def metric_sum(value, name: Optional[str] = None) -> float:
    return float(allreduce(value, hvd.Sum, name))


# --- checkpoints -----------------------------------------------------------------------------------

def _write_npz(payload: dict, path) -> None:
    arrays = {f"model/{i:05d}": a for i, a in enumerate(payload["model"])}
    arrays.update({f"optimizer/{i:05d}": a for i, a in enumerate(payload["optimizer"])})
    with open(path, "wb") as f:
        np.savez(f, epoch=np.int64(payload["epoch"]), **arrays)


def _read_npz(path) -> dict:
    with np.load(path) as z:
        keys = sorted(z.files)
        return {"epoch": int(z["epoch"]),
                "model": [z[k] for k in keys if k.startswith("model/")],
                "optimizer": [z[k] for k in keys if k.startswith("optimizer/")]}


def save_checkpoint(directory: str, epoch: int, model: keras.Model, optimizer: keras.optimizers.Optimizer,
                    keep: int = 3):
    """Rank 0 writes the model's and optimizer's variables for `epoch` atomically. Path on rank 0."""
    from hvdk8s import checkpoint

    if hvd.rank() != 0:
        return None
    payload = {"epoch": epoch, "model": [np.asarray(v) for v in model.get_weights()],
               "optimizer": [np.asarray(v) for v in optimizer.variables]}
    return checkpoint.save(directory, epoch, payload, _write_npz, keep)


def load_checkpoint(directory: str, model: keras.Model, optimizer: Optional[keras.optimizers.Optimizer] = None,
                    root_rank: int = 0) -> tuple[int, dict]:
    """Resume from the newest valid checkpoint, read by root_rank and broadcast to all ranks.
    Returns (epoch, {"path": file}) or (0, {}) when there is none."""
    from hvdk8s import checkpoint

    found = None
    if hvd.rank() == root_rank:
        n_weights = len(model.get_weights())
        found = checkpoint.load_latest(directory, _read_npz, valid=lambda d: len(d["model"]) == n_weights)
    epoch, extra = 0, {}
    if found is not None:
        epoch, path, payload = found
        model.set_weights(payload["model"])
        if optimizer is not None:
            if not optimizer.built:
                optimizer.build(model.trainable_variables)
            for var, value in zip(optimizer.variables, payload["optimizer"]):
                var.assign(value)
        extra = {"path": str(path)}
    epoch, extra = hvd.broadcast_object((epoch, extra), root_rank, name="hvdk8s.resume")
    broadcast_state(model, optimizer, root_rank)
    return epoch, extra


# --- Keras callbacks (what Horovod's Keras callbacks do, on Keras 3) -------------------------------

class BroadcastInitialState(keras.callbacks.Callback):
    """At the start of training, give every rank root_rank's model variables and optimizer state."""

    def __init__(self, root_rank: int = 0):
        super().__init__()
        self.root_rank = root_rank
        self.done = False

    def on_train_begin(self, logs=None):
        if getattr(self.model, "jit_compile", False):
            raise ValueError("compile the model with jit_compile=False: Horovod's TensorFlow ops have no "
                             "XLA kernels")
        if not self.done:
            broadcast_state(self.model, self.model.optimizer, self.root_rank)
            self.done = True


class MetricAverage(keras.callbacks.Callback):
    """At the end of each epoch, replace every logged metric by its mean over the ranks."""

    def on_epoch_end(self, epoch, logs=None):
        if logs:
            names = sorted(k for k, v in logs.items() if np.ndim(v) == 0)
            values = allreduce([float(logs[k]) for k in names], hvd.Average, name=f"hvdk8s.metrics.{epoch}")
            logs.update(dict(zip(names, values.tolist())))


class LearningRateWarmup(keras.callbacks.Callback):
    """Ramp the learning rate linearly from `initial_lr` to `target_lr` over the first warmup_epochs
    (Goyal et al. 2017), then hold it at `target_lr`."""

    def __init__(self, initial_lr: float, target_lr: float, warmup_epochs: float, steps_per_epoch: int):
        super().__init__()
        self.initial_lr, self.target_lr = initial_lr, target_lr
        self.warmup_steps = round(warmup_epochs * steps_per_epoch)
        self.steps_per_epoch = steps_per_epoch
        self.epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        from hvdk8s.train import warmup_lr

        step = self.epoch * self.steps_per_epoch + batch
        if step <= self.warmup_steps:
            self.model.optimizer.learning_rate.assign(
                warmup_lr(step, self.warmup_steps, self.initial_lr, self.target_lr))


class Checkpoint(keras.callbacks.Callback):
    """Rank 0 saves model and optimizer every `interval_epochs` epochs (1-based epoch numbers)."""

    def __init__(self, directory: str, interval_epochs: int = 1, keep: int = 3, on_saved=None):
        super().__init__()
        self.directory, self.interval, self.keep = directory, interval_epochs, keep
        self.on_saved = on_saved

    def on_epoch_end(self, epoch, logs=None):
        if (epoch + 1) % self.interval == 0:
            path = save_checkpoint(self.directory, epoch + 1, self.model, self.model.optimizer, self.keep)
            if path is not None and self.on_saved:
                self.on_saved(epoch + 1, path)


def callbacks(root_rank: int = 0) -> list:
    """The callbacks every distributed `model.fit` needs: initial broadcast, metric averaging."""
    return [BroadcastInitialState(root_rank), MetricAverage()]


def scaled_learning_rate(base: float, rule: str = "linear", backward_passes_per_step: int = 1) -> float:
    from hvdk8s.train import lr_scale

    return base * lr_scale(rule, hvd.size(), backward_passes_per_step)


__all__ = ["init", "distribute", "allreduce_gradients", "broadcast_state", "broadcast_variables",
           "metric_average", "metric_sum", "allreduce", "save_checkpoint", "load_checkpoint", "callbacks",
           "BroadcastInitialState", "MetricAverage", "LearningRateWarmup", "Checkpoint", "log", "verbose",
           "rank", "size", "local_rank", "local_size", "cross_size", "resolve_compression",
           "scaled_learning_rate"]
