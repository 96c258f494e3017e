"""What each rank runs: a JobSpec in, a trained model (and checkpoints) out.

`hvdk8s train JOB.yaml` calls `run`, under horovodrun/mpirun locally or in the pods of an MPIJob.
"""
from __future__ import annotations

import hashlib
import math
from typing import Any, Mapping

import numpy as np

from hvdk8s.spec import JobSpec


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


def lr_scale(rule: str, ranks: int, backward_passes_per_step: int) -> float:
    """How much the learning rate grows with the global batch (ranks x accumulated passes)."""
    n = ranks * backward_passes_per_step
    return {"linear": float(n), "sqrt": math.sqrt(n), "none": 1.0}[rule]


def warmup_lr(step: int, warmup_steps: int, base: float, peak: float) -> float:
    """Linear ramp from `base` to `peak` over the first `warmup_steps` optimizer steps (Goyal et al. 2017)."""
    if warmup_steps <= 0 or step >= warmup_steps:
        return peak
    return base + (peak - base) * (step + 1) / warmup_steps


def run(spec: JobSpec, *, resume: bool = True) -> dict[str, Any]:
    """Train `spec` as one rank; returns rank 0's summary (test_accuracy, epochs, seconds, digest)."""
    from hvdk8s.data.datasets import holding

    if spec.framework == "pytorch":
        from hvdk8s.train_torch import run as run_framework
    else:
        from hvdk8s.train_tf import run as run_framework
    with holding(spec.dataset):  # a cached dataset is not evicted while it trains
        return run_framework(spec, resume=resume)
