"""The TensorFlow / Keras 3 training loop behind `hvdk8s train` (framework: tensorflow): `model.fit`
with hvdk8s's distributed optimizer and callbacks, reporting the same events as the PyTorch loop."""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from hvdk8s.spec import JobSpec
from hvdk8s.train import lr_scale, parameter_digest


def weights_digest(model) -> str:
    return parameter_digest({f"{i:05d}": w for i, w in enumerate(model.get_weights())})


def _make_optimizer(t, lr: float):
    import keras

    decay = t.weight_decay or None
    if t.optimizer == "sgd":
        return keras.optimizers.SGD(lr, momentum=t.momentum, weight_decay=decay)
    if t.optimizer == "adam":
        return keras.optimizers.Adam(lr, weight_decay=decay)
    return keras.optimizers.AdamW(lr, weight_decay=t.weight_decay)


def run(spec: JobSpec, *, resume: bool = True) -> dict[str, Any]:
    import keras

    import hvdk8s.tensorflow as htf
    from hvdk8s.data.datasets import open_splits
    from hvdk8s.data.tensorflow import sharded_dataset
    from hvdk8s.events import Reporter
    from hvdk8s.models import registry

    t = spec.training
    htf.init()
    rank, size = htf.rank(), htf.size()
    report = Reporter(enabled=rank == 0)
    keras.utils.set_random_seed(t.seed)

    splits = open_splits(spec.dataset)
    info = splits["train"].info
    entry = registry.get(spec.model.name)
    model = entry.build("tensorflow", spec.model.args, **info)
    k = t.backward_passes_per_step
    peak_lr = t.learning_rate * lr_scale(t.lr_scaling, size, k)
    optimizer = htf.distribute(_make_optimizer(t, peak_lr), compression=t.compression, backward_passes_per_step=k)
    # Sum of per-sample losses weighted by size / global batch: Horovod's average is the global mean.
    tokens = info.get("seq_len", 1) if entry.task == "language_model" else 1
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum"),
                  weighted_metrics=[], metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
                  jit_compile=False)  # Horovod's ops have no XLA kernels

    start_epoch = 1
    if t.checkpoint.dir and resume:
        done_epoch, extra = htf.load_checkpoint(t.checkpoint.dir, model, optimizer)
        start_epoch = done_epoch + 1
        if done_epoch:
            report.emit("resume", epoch=done_epoch, path=extra["path"], digest=weights_digest(model))

    train_data = sharded_dataset(splits["train"], t.batch_size, rank=rank, size=size, seed=t.seed,
                                 first_epoch=start_epoch, weights=True, weight_scale=1.0 / tokens)
    test_data = sharded_dataset(splits["test"], max(256, t.batch_size), rank=rank, size=size, shuffle=False)
    steps = int(train_data.cardinality())
    report.emit("start", job=spec.name, framework=spec.framework, model=spec.model.name,
                dataset=spec.dataset.name or spec.dataset.path, ranks=size,
                compression=htf.resolve_compression(t.compression), lr=peak_lr, steps_per_epoch=steps,
                epochs=t.epochs, start_epoch=start_epoch)

    def evaluate() -> tuple[float, float]:
        sums = np.zeros(4)  # loss, correct, counted, samples
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")
        for x, y in test_data:
            logits = model(x, training=False)
            sums += [float(loss_fn(y, logits)) / tokens, float(np.sum(np.argmax(logits, -1) == y.numpy())),
                     float(np.size(y)), float(len(y))]
        loss_sum, correct, counted, samples = htf.allreduce(sums, htf.Sum, name="hvdk8s.test_metrics")
        return loss_sum / max(samples, 1), correct / max(counted, 1)

    class Report(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.began = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            seconds = time.perf_counter() - self.began
            test_loss, test_acc = evaluate()
            self.test_accuracy = test_acc
            report.emit("epoch", epoch=epoch + 1, epochs=t.epochs, loss=float(logs["loss"]),
                        accuracy=float(logs["accuracy"]), test_loss=test_loss, test_accuracy=test_acc,
                        samples_per_s=len(splits["train"]) / seconds, seconds=seconds)

    reporter = Report()
    callbacks = [*htf.callbacks(), htf.LearningRateWarmup(t.learning_rate, peak_lr, t.warmup_epochs, steps // k),
                 reporter]
    if t.checkpoint.dir:
        callbacks.append(htf.Checkpoint(t.checkpoint.dir, t.checkpoint.interval_epochs, t.checkpoint.keep,
                                        on_saved=lambda e, p: report.emit("checkpoint", epoch=e, path=str(p))))
    began = time.perf_counter()
    if start_epoch <= t.epochs:
        model.fit(train_data, epochs=t.epochs, initial_epoch=start_epoch - 1, callbacks=callbacks, verbose=0,
                  shuffle=False)  # the pipeline already reorders every epoch
        test_acc = reporter.test_accuracy
        if t.checkpoint.dir and t.epochs % t.checkpoint.interval_epochs:
            htf.save_checkpoint(t.checkpoint.dir, t.epochs, model, optimizer, t.checkpoint.keep)
    else:  # nothing left to train: report the restored model
        test_acc = evaluate()[1]
    summary = {"test_accuracy": test_acc, "epochs": t.epochs, "seconds": time.perf_counter() - began,
               "digest": weights_digest(model)}
    report.emit("done", **summary)
    return summary
