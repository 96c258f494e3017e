"""What each rank runs for `hvdk8s train`: a JobSpec in, a trained model (and checkpoints) out.

`job` holds everything both frameworks share (the epoch loop, learning-rate policy, checkpoint timing,
events, summary), `elastic` the same loop under Horovod elastic; `torch` and `tensorflow` supply only
their steps, evaluation, checkpoint I/O and elastic state.
"""
from __future__ import annotations

from typing import Any

from hvdk8s.data.datasets import holding, last_sync
from hvdk8s.factories import dataset_splits
from hvdk8s.runfiles import make_dirs
from hvdk8s.spec import JobSpec

from .elastic import run_elastic_epochs
from .job import run_epochs


def run(spec: JobSpec, *, resume: bool = True) -> dict[str, Any]:
    """Train `spec` as one rank; returns the summary (test_accuracy, epochs, seconds, digest)."""
    if spec.entrypoint is not None:
        raise ValueError("this job runs its own entrypoint, not hvdk8s's trainer")
    with holding(spec.dataset):  # a cached dataset is not evicted while it trains
        splits = dataset_splits(spec.dataset)
        if spec.framework == "pytorch":  # one framework per rank: the other is never imported
            from .torch import TorchSteps as Steps
        else:
            from .tensorflow import KerasSteps as Steps
        make_dirs()  # before Steps starts Horovod, which opens its timeline and autotune log then
        steps = Steps(spec, splits)
        synced = last_sync(spec.dataset)
        if synced is not None:
            steps.metrics.cache(**synced)
        steps.metrics.await_first_scrape(spec.observability.metrics.first_scrape_timeout_seconds)
        if spec.training.elastic is not None:
            summary = run_elastic_epochs(spec, steps, resume=resume)
        else:
            summary = run_epochs(spec, steps, steps.lr, resume=resume)
        # The last evaluation's allreduce came after every rank's last end_epoch: all final values are set.
        steps.metrics.linger(spec.observability.metrics.final_scrape_timeout_seconds)
        return summary
