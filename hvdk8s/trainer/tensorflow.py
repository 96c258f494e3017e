"""The TensorFlow / Keras 3 part of `hvdk8s train`: one `model.fit` epoch at a time with hvdk8s's
distributed optimizer, evaluation and checkpoint I/O; the loop itself is `hvdk8s.trainer.job.run_epochs`."""
from __future__ import annotations

from typing import Any, Callable, Optional

import keras
import numpy as np

import hvdk8s.tensorflow as htf
from hvdk8s.data.rankplans import part_bounds, step_counts, unread_after
from hvdk8s.data.tensorflow import sharded_dataset
from hvdk8s.spec import JobSpec

from .job import EpochStats, LRSchedule, Progress, build_model, parameter_digest, powersgd_settings


def make_optimizer(t, lr: float) -> keras.optimizers.Optimizer:
    """The job's optimizer; clipping acts on the averaged (and, for fp16, unscaled) gradients because
    the distributed wrapper reduces them before Keras's apply() clips."""
    clip = {"global_clipnorm": t.clip_grad_norm} if t.clip_grad_norm else {}
    decay = t.weight_decay or None
    if t.optimizer == "sgd":
        opt = keras.optimizers.SGD(lr, momentum=t.momentum, weight_decay=decay, **clip)
    elif t.optimizer == "adam":
        opt = keras.optimizers.Adam(lr, weight_decay=decay, **clip)
    else:
        opt = keras.optimizers.AdamW(lr, weight_decay=t.weight_decay, **clip)
    return keras.optimizers.LossScaleOptimizer(opt) if t.precision == "fp16" else opt


class _Callbacks(keras.callbacks.Callback):
    """Per batch: the warm-up rate and progress; at the epoch's end: the logs as averaged over ranks."""

    def __init__(self, owner: "KerasSteps"):
        super().__init__()
        self.owner = owner
        self.progress: Optional[Progress] = None
        self.epoch_logs: dict = {}

    def on_train_batch_begin(self, batch, logs=None):
        o = self.owner
        step = (self.epoch - 1) * (o.steps_per_epoch // o.k) + o.steps_read + batch // o.k
        if step <= o.lr.warmup_steps:
            self.model.optimizer.learning_rate.assign(o.lr.at(step))

    def on_train_batch_end(self, batch, logs=None):
        o = self.owner
        if self.progress is not None:
            self.progress.step(batch + 1, int(o.epoch_counts[:batch + 1].sum()),
                               lambda: float((logs or {}).get("loss", float("nan"))))
        every = o.commit_every * o.k
        if o.commit is not None and (batch + 1) % every == 0 and batch + 1 < len(o.epoch_counts):
            o.commit(unread_after(o.epoch_order, o.size, o.training.batch_size, batch + 1))

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_logs = dict(logs or {})


class KerasSteps:
    def __init__(self, spec: JobSpec, splits: dict[str, Any]):
        t = self.training = spec.training
        htf.init()
        self.rank, self.size = htf.rank(), htf.size()
        self.metrics = htf.metrics(job=spec)
        keras.utils.set_random_seed(t.seed)
        htf.set_precision(t.precision)  # before the model is built: layers take the policy then
        info = splits["train"].info
        self.n_train = len(splits["train"])
        self.model = build_model(spec, info)
        self.k = t.backward_passes_per_step
        self.splits, self.seed = splits, t.seed
        self._plan_ranks()
        # Elastic: no broadcast here (nothing before the elastic function may be collective).
        self.optimizer = htf.distribute(self.model, make_optimizer(t, self.lr.peak), compression=t.compression,
                                        backward_passes_per_step=self.k, broadcast=t.elastic is None,
                                        powersgd=powersgd_settings(t), shard_optimizer_state=t.shard_optimizer_state)
        # Sum of per-sample losses weighted by size / global batch: Horovod's average is the global mean.
        self.tokens = info.get("seq_len", 1) if spec.model.resolved_task == "language_model" else 1
        self.model.compile(optimizer=self.optimizer,
                           loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum"),
                           weighted_metrics=[], metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
                           jit_compile=False)  # Horovod's ops have no XLA kernels
        self.compression = htf.resolve_compression(t.compression)
        self.callbacks = _Callbacks(self)
        # Broadcast once, metrics averaged, ours last. Elastic: the state's sync is the broadcast (a
        # joining worker's first fit must not start one the others would not join).
        first = htf.callbacks() if t.elastic is None else [htf.MetricAverage()]
        self.fit_callbacks = [*first, self.callbacks, htf.MetricsCallback(self._rank_samples, self.metrics)]
        self.commit, self.commit_every = None, t.elastic.commit_every_steps if t.elastic else 0
        self.steps_read = 0

    def _plan_ranks(self) -> None:
        """Step counts, learning rate and data for this rank and the number of ranks (again after an
        elastic change)."""
        t = self.training
        self.epoch_counts = self.global_counts = step_counts(self.n_train, self.size, t.batch_size)
        self.steps_per_epoch = len(self.global_counts)
        self.lr = LRSchedule.for_job(t, self.size, self.steps_per_epoch // self.k)
        self.train_data = None
        self.test_data = sharded_dataset(self.splits["test"], max(256, t.batch_size), rank=self.rank,
                                         size=self.size, shuffle=False)

    def reshard(self) -> None:
        self.rank, self.size = htf.rank(), htf.size()
        self._plan_ranks()

    def _rank_samples(self, batch: int) -> int:
        """Samples in this rank's `batch` of the current pass (its contiguous part of the pass's order,
        cut into batches; see hvdk8s.data.rankplans)."""
        start, stop = part_bounds(int(self.epoch_counts.sum()), self.rank, self.size)
        return max(0, min(self.training.batch_size, stop - start - batch * self.training.batch_size))

    def elastic_state(self, **attrs: Any) -> htf.ElasticState:
        return htf.ElasticState(self.model, self.optimizer, **attrs)

    def run_elastic(self, func):
        return htf.run_elastic(func)

    def load(self, directory: str, broadcast: bool = True) -> tuple[int, dict]:
        return htf.load_checkpoint(directory, self.model, self.optimizer, broadcast=broadcast)

    def train_epoch(self, epoch: int, progress: Progress, order: Optional[np.ndarray] = None,
                    commit: Optional[Callable[[np.ndarray], None]] = None) -> EpochStats:
        """One epoch, or (elastic) what is left of it: `order`; see hvdk8s.trainer.torch."""
        self.callbacks.progress, self.callbacks.epoch = progress, epoch
        if commit is None:
            if self.train_data is None:  # each pass over it is the next epoch, from the first one trained
                self.train_data = sharded_dataset(self.splits["train"], self.training.batch_size, rank=self.rank,
                                                  size=self.size, seed=self.seed, first_epoch=epoch, weights=True,
                                                  weight_scale=1.0 / self.tokens)
            data, samples = self.train_data, self.n_train
        else:  # elastic: a pass over this epoch's order (or what is left of it) for the ranks there are now
            self.epoch_order = self.splits["train"].epoch_order(self.seed, epoch) if order is None else order
            samples = len(self.epoch_order)
            self.epoch_counts = step_counts(samples, self.size, self.training.batch_size)
            per_epoch = self.steps_per_epoch // self.k
            self.steps_read = round((self.n_train - samples) / self.n_train * per_epoch)
            data = sharded_dataset(self.splits["train"], self.training.batch_size, rank=self.rank, size=self.size,
                                   seed=self.seed, first_epoch=epoch, weights=True, weight_scale=1.0 / self.tokens,
                                   order=self.epoch_order)
        self.commit = commit
        try:
            self.model.fit(data, epochs=epoch, initial_epoch=epoch - 1, callbacks=self.fit_callbacks,
                           verbose=0, shuffle=False)  # the pipeline already reorders every epoch
        finally:
            self.commit, self.steps_read, self.epoch_counts = None, 0, self.global_counts
        logs = self.callbacks.epoch_logs
        return EpochStats(float(logs["loss"]), float(logs["accuracy"]), samples)

    def evaluate(self) -> tuple[float, float]:
        sums = np.zeros(4)  # loss, correct, counted, samples
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")
        for x, y in self.test_data:
            logits = self.model(x, training=False)
            sums += [float(loss_fn(y, logits)) / self.tokens, float(np.sum(np.argmax(logits, -1) == y.numpy())),
                     float(np.size(y)), float(len(y))]
        loss_sum, correct, counted, samples = htf.allreduce(sums, htf.Sum, name="hvdk8s.test_metrics")
        return loss_sum / max(samples, 1), correct / max(counted, 1)

    def save(self, directory: str, epoch: int, keep: int, extra: dict) -> Optional[str]:
        return htf.save_checkpoint(directory, epoch, self.model, self.optimizer, extra=extra, keep=keep)

    def digest(self) -> str:
        return parameter_digest({f"{i:05d}": w for i, w in enumerate(self.model.get_weights())})

    def loss_scale(self) -> Optional[float]:
        scale = getattr(self.optimizer, "dynamic_scale", None)  # a LossScaleOptimizer's, once built
        return None if scale is None else float(np.asarray(scale))

    def learning_rate(self) -> float:
        return float(np.asarray(self.optimizer.learning_rate))  # a LossScaleOptimizer's is its inner one's
