"""What a job's own code must pass before any rank starts (at `hvdk8s validate` and `hvdk8s launch`):
its factories import and return the right things, and a script carried to a cluster exists."""
from __future__ import annotations

from pathlib import Path

from hvdk8s import metrics
from hvdk8s.checkpoint import check_writable
from hvdk8s.entrypoint import carried_files
from hvdk8s.factories import FactoryError, build_model, dataset_splits, importable_from
from hvdk8s.spec import JobFileError, JobSpec


def check_checkpoint_dir(spec: JobSpec, source: str) -> None:
    """The checkpoint directory can be created and written here (a local launch's ranks share it)."""
    if spec.training.checkpoint.dir:
        problem = check_writable(spec.training.checkpoint.dir)
        if problem:
            raise JobFileError(source, [("training.checkpoint.dir", problem)])


def check_metrics_ports(spec: JobSpec, np: int, source: str) -> None:
    """A local job with metrics on: its ranks' ports are free here (else the first rank fails after the
    others started, and they fail in their first collective)."""
    m = spec.observability.metrics
    if m.enabled:
        problem = metrics.unusable_port(m.port, np)
        if problem:
            raise JobFileError(source, [("observability.metrics.port", problem)])


def check_code(spec: JobSpec, job_dir: Path, source: str) -> None:
    """Import and call the job's factories the way a rank will (building the model once, so the job's
    framework must be installed), and read a carried entrypoint script; JobFileError naming the field."""
    carried_files(spec, job_dir, source)
    if spec.entrypoint is not None or (spec.model.factory is None and spec.dataset.factory is None):
        return
    with importable_from(job_dir):
        try:
            splits = dataset_splits(spec.dataset)
            if spec.model.factory is not None:
                build_model(spec.model, spec.framework, splits["train"].info)
        except FactoryError as e:
            raise JobFileError(source, [(e.field, e.message)]) from None
