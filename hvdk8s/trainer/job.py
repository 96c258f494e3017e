"""What every training loop shares, whatever the framework: the learning-rate policy, when to
checkpoint, the events rank 0 reports, the epoch loop and the summary. A framework supplies only its
`Steps` (one epoch of steps, evaluation, checkpoint I/O) and is driven by `run_epochs`."""
from __future__ import annotations

import hashlib
import math
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Protocol

import numpy as np

from hvdk8s.checkpoint import check_writable
from hvdk8s.core.errors import UserError
from hvdk8s.spec.workload import PowerSGDSpec
from hvdk8s.events import Reporter
from hvdk8s.factories import build_model as from_factory
from hvdk8s.models import registry
from hvdk8s.runfiles import sinks, written
from hvdk8s.schedule import lr_scale, warmup_lr
from hvdk8s.spec import JobSpec

PROGRESS_EVERY_S = 1.0  # rank 0 reports progress within an epoch at most this often


def progress_interval() -> float:
    """PROGRESS_EVERY_S, or HVDK8S_PROGRESS_EVERY_S where it is a number >= 0 (0: every step; a log
    stack may want fewer). Anything else there keeps the default: no rank fails over a reporting rate."""
    try:
        value = float(os.environ.get("HVDK8S_PROGRESS_EVERY_S", PROGRESS_EVERY_S))
    except ValueError:
        return PROGRESS_EVERY_S
    return value if math.isfinite(value) and value >= 0 else PROGRESS_EVERY_S


def parameter_digest(arrays: Mapping[str, Any]) -> str:
    """A short hash of named arrays (a torch state dict, or numpy arrays), to compare models across
    ranks, runs and checkpoint files."""
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = arrays[name]
        if hasattr(a, "detach"):  # a torch tensor
            a = a.detach().cpu().numpy()
        h.update(name.encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class LRSchedule:
    """The job's rate: `learning_rate` for one rank, scaled with the global batch, reached by a linear
    warm-up over `warmup_epochs` (counted in optimizer steps)."""

    base: float
    peak: float
    warmup_steps: int

    @classmethod
    def for_job(cls, training, ranks: int, optimizer_steps_per_epoch: int) -> "LRSchedule":
        peak = training.learning_rate * lr_scale(training.lr_scaling, ranks, training.backward_passes_per_step)
        return cls(training.learning_rate, peak, round(training.warmup_epochs * optimizer_steps_per_epoch))

    def at(self, optimizer_step: int) -> float:
        return warmup_lr(optimizer_step, self.warmup_steps, self.base, self.peak)


def checkpoint_due(training, epoch: int) -> bool:
    """Every `interval_epochs`, and always after the last epoch (so a finished run resumes as finished)."""
    return bool(training.checkpoint.dir) and (epoch % training.checkpoint.interval_epochs == 0
                                              or epoch == training.epochs)


@dataclass(frozen=True)
class EpochStats:
    """One epoch's training figures over all ranks."""

    loss: float
    accuracy: float
    samples: int


class Progress:
    """Rank 0's progress within an epoch, rate-limited; `loss` is computed only when a report is due
    (reading a value off a GPU stalls it)."""

    def __init__(self, report: Reporter, epoch: int, steps: int):
        self.report, self.epoch, self.steps = report, epoch, steps
        self.every = progress_interval()
        self.began = self.last = time.perf_counter()

    def step(self, done: int, samples: int, loss: Callable[[], float]) -> None:
        if not self.report.enabled or done >= self.steps:
            return
        now = time.perf_counter()
        if now - self.last >= self.every:
            self.report.emit("progress", epoch=self.epoch, step=done, steps=self.steps, loss=float(loss()),
                             samples_per_s=samples / max(now - self.began, 1e-9))
            self.last = now


class Steps(Protocol):
    """What a framework supplies to the shared loop."""

    rank: int
    size: int
    steps_per_epoch: int
    compression: str  # as resolved: "fp16", "none" or "powersgd"
    metrics: Any      # this rank's hvdk8s.metrics.Metrics (records nothing when metrics are off)

    def load(self, directory: str, broadcast: bool = True) -> tuple[int, dict]: ...
    def train_epoch(self, epoch: int, progress: Progress, order=None, commit=None) -> EpochStats: ...
    def evaluate(self) -> tuple[float, float]: ...
    def save(self, directory: str, epoch: int, keep: int, extra: dict) -> Optional[str]: ...
    def digest(self) -> str: ...
    def loss_scale(self) -> Optional[float]: ...  # fp16: the current dynamic loss scale
    def learning_rate(self) -> float: ...  # the rate the trainer last set on the optimizer
    # Elastic training only (training.elastic): the framework's ElasticState and run_elastic, and
    # re-planning for the ranks there are after a change of workers.
    def elastic_state(self, **attrs: Any): ...
    def run_elastic(self, func: Callable): ...
    def reshard(self) -> None: ...


def begin(spec: JobSpec, steps: Steps, *, resume: bool, broadcast: bool = True) -> tuple[Reporter, int]:
    """Check the checkpoint directory, resume from it, and return rank 0's reporter and the first epoch
    to train. broadcast=False (elastic): rank 0 alone reads the checkpoint; the state sync shares it.
    The caller closes the reporter (its sinks: TensorBoard's file), whether training ends or fails."""
    t = spec.training
    report = Reporter(enabled=steps.rank == 0, sinks=sinks(spec))  # every rank: any may become rank 0 (elastic)
    if t.checkpoint.dir and steps.rank == 0:  # rank 0 writes them: fail now, not after an epoch
        problem = check_writable(t.checkpoint.dir)
        if problem:
            raise UserError(f"training.checkpoint.dir: {problem}")
    start_epoch = 1
    if t.checkpoint.dir and resume:
        done_epoch, extra = steps.load(t.checkpoint.dir, broadcast=broadcast)
        start_epoch = done_epoch + 1
        if done_epoch:
            report.emit("resume", epoch=done_epoch, path=extra["path"], digest=steps.digest())
    return report, start_epoch


def announce(spec: JobSpec, steps: Steps, lr: "LRSchedule", report: Reporter, start_epoch: int) -> None:
    t = spec.training
    report.emit("start", job=spec.name, framework=spec.framework, model=spec.model.label,
                dataset=spec.dataset.label, ranks=steps.size, compression=steps.compression,
                precision=t.precision, lr=lr.peak, steps_per_epoch=steps.steps_per_epoch, epochs=t.epochs,
                start_epoch=start_epoch)


def end_epoch(spec: JobSpec, steps: Steps, report: Reporter, epoch: int, stats: EpochStats, seconds: float) -> float:
    """Evaluate, report the epoch and checkpoint when due; returns the test accuracy."""
    t = spec.training
    test_loss, test_acc = steps.evaluate()
    scale = {"loss_scale": steps.loss_scale()} if t.precision == "fp16" else {}
    report.emit("epoch", epoch=epoch, epochs=t.epochs, loss=stats.loss, accuracy=stats.accuracy,
                test_loss=test_loss, test_accuracy=test_acc, samples_per_s=stats.samples / seconds,
                seconds=seconds, lr=steps.learning_rate(), **scale)
    if checkpoint_due(t, epoch):
        path = steps.save(t.checkpoint.dir, epoch, t.checkpoint.keep, {"job": spec.name})
        if path is not None:
            report.emit("checkpoint", epoch=epoch, path=str(path))
    return test_acc


def finish(spec: JobSpec, steps: Steps, report: Reporter, began: float, test_acc: float) -> dict[str, Any]:
    if math.isnan(test_acc):  # nothing was left to train (the same on every rank): report the restored model
        test_acc = steps.evaluate()[1]
    summary = {"test_accuracy": test_acc, "epochs": spec.training.epochs, "seconds": time.perf_counter() - began,
               "digest": steps.digest()}
    report.emit("done", **summary)
    for what, path in written(spec).items():  # where to look, last
        report.emit("file", what=what, path=path)
    return summary


def run_epochs(spec: JobSpec, steps: Steps, lr: LRSchedule, *, resume: bool = True) -> dict[str, Any]:
    """Resume, train the remaining epochs, evaluate, checkpoint; report every event on rank 0.
    Returns the summary (test_accuracy, epochs, seconds, digest)."""
    report, start_epoch = begin(spec, steps, resume=resume)
    try:
        announce(spec, steps, lr, report, start_epoch)
        began = time.perf_counter()
        test_acc = math.nan
        for epoch in range(start_epoch, spec.training.epochs + 1):
            epoch_began = time.perf_counter()
            stats = steps.train_epoch(epoch, Progress(report, epoch, steps.steps_per_epoch))
            test_acc = end_epoch(spec, steps, report, epoch, stats, time.perf_counter() - epoch_began)
        return finish(spec, steps, report, began, test_acc)
    finally:
        report.close()


def build_model(spec: JobSpec, info: dict[str, Any]):
    """The job's model for its framework: a registered one, or the user's factory's (checked)."""
    if spec.model.factory is not None:
        return from_factory(spec.model, spec.framework, info)
    return registry.get(spec.model.name).build(spec.framework, spec.model.args, **info)


def powersgd_settings(training) -> Optional[dict]:
    """distribute()'s PowerSGD settings for the job (None unless its compression is powersgd)."""
    if training.compression != "powersgd":
        return None
    return (training.powersgd or PowerSGDSpec()).model_dump()
